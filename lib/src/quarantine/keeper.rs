//! [`Keeper`]: the quarantine in a running process. It hears the monitor's scans, writes
//! the ledger from a thread of its own, and answers whether an object may be reconciled.

use std::collections::{HashMap, HashSet};
#[cfg(feature = "metrics")]
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::{
    Error, Failure, Hang, LateFrame, Ledger, Lift, Quarantine, Standing, Store, StoreError, Subject,
};
use crate::guard::ObjectKey;
#[cfg(feature = "metrics")]
use crate::metrics::Metrics;
use crate::monitor::verdict::fmt_duration;
use crate::monitor::{Observer, Scan};

/// The log target of the quarantine's lines.
pub(crate) const TARGET: &str = "reconcile_watchdog::quarantine";

/// Jobs waiting for the thread at most. A scan's failures turned away are handed on
/// again at the next scan; a lift's forgetting or a reload, kept aside (see
/// [`Shared::overflow`]).
pub(crate) const QUEUE: usize = 256;

/// The most new liveness failures one scan hands on: a mass hang records its first few.
const PER_SCAN: usize = 16;

/// The quarantined objects the debug views name; the rest are counted.
pub(crate) const QUARANTINED_NAMED: usize = 10;

/// How often the thread reads the ledger again, for what other replicas or a person
/// wrote (an entry deleted by hand lifts its quarantine within this).
const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// A quarantined object is looked at again at least this often, for a lift by hand.
const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// Tries of one read-modify-write that met another writer.
const CONFLICT_TRIES: usize = 5;

/// How long a reconcile waits at most for the ledger's first read.
const LOAD_WAIT: Duration = Duration::from_secs(10);

/// Finds an object's uid and generation, by its key.
type Identify = Box<dyn Fn(&ObjectKey) -> Option<(Option<String>, Option<i64>)> + Send + Sync>;

/// What the thread is asked to do.
enum Job {
    /// Record the liveness failures one scan found, and the stacks' own frames of
    /// failures recorded before their stack was captured: one write for them all.
    Failed(Vec<Failure>, Vec<LateFrame>),
    /// Forget an entry whose quarantine was lifted.
    Forget {
        controller: String,
        object: String,
        latest: Option<SystemTime>,
    },
    /// Read the ledger again now.
    Reload,
    /// Wake up to see `stop`.
    Wake,
}

/// An Event to publish on the object, and what its note says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// `ReconcileQuarantined` or `ReconcileQuarantineLifted`.
    pub(crate) reason: &'static str,
    /// Whether it is a warning (a quarantine) or normal (a lift).
    pub(crate) warning: bool,
    /// What happened, why, since when, until when, and how to lift it.
    pub(crate) note: String,
}

/// Whether a reconcile may run, as [`Keeper::admit`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Run it; `lifted` is set when its quarantine just ended.
    Reconcile {
        /// The lift, the first time it is seen.
        lifted: Option<Announcement>,
    },
    /// Skip it, and look at it again after `requeue`.
    Skip {
        /// When to look again: the quarantine's end, or sooner for a lift by hand.
        requeue: Duration,
        /// The quarantine, the first time this process sees it.
        announced: Option<Announcement>,
    },
}

/// What every part of the keeper shares with its thread.
struct Shared {
    quarantine: Quarantine,
    ledger: RwLock<Ledger>,
    loaded: AtomicBool,
    loaded_tx: tokio::sync::watch::Sender<bool>,
    /// Gave up waiting for the first read once: later reconciles do not wait.
    gave_up: AtomicBool,
    identities: RwLock<HashMap<String, Identify>>,
    /// The objects this process has announced as quarantined, by controller and
    /// object: their quarantine's start.
    announced: Mutex<HashMap<(String, String), SystemTime>>,
    /// Which store errors have been logged (once each).
    warned: Mutex<HashSet<&'static str>>,
    stop: AtomicBool,
    /// The forgetting of lifted entries and the reloads a full queue turned away: the
    /// thread takes them with its next batch, so nothing asked is lost. At most one
    /// job per entry of the ledger in memory (which holds `max_objects`), and one
    /// reload.
    overflow: Mutex<Vec<Job>>,
    /// Jobs a full queue turned away (each handed on again or kept aside).
    turned_away: AtomicU64,
    writes: AtomicU64,
    #[cfg(feature = "metrics")]
    metrics: OnceLock<Arc<Metrics>>,
}

/// The quarantine of one process; see the [module](super).
///
/// Plug it into the watchdog with [`Builder::quarantine`](crate::Builder::quarantine)
/// (it hears the scans), give it its store with [`start`](Self::start), and let the
/// kube integration ask it before each reconcile (`kube::Controllers::quarantine`).
pub struct Keeper {
    shared: Arc<Shared>,
    jobs: SyncSender<Job>,
    receiver: Mutex<Option<Receiver<Job>>>,
    /// The reconciles already recorded as failing liveness (the monitor's alone), with
    /// the failure's object and time while its stack's own frame is still unknown.
    recorded: Mutex<HashMap<u64, Option<LateFrame>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Job {
    /// Whether `self`, kept aside, makes `kept` useless: a reload another, a
    /// forgetting of an entry an older one of the same entry.
    fn replaces(&self, kept: &Job) -> bool {
        match (self, kept) {
            (Self::Reload, Self::Reload) => true,
            (
                Self::Forget {
                    controller, object, ..
                },
                Self::Forget {
                    controller: c,
                    object: o,
                    ..
                },
            ) => controller == c && object == o,
            _ => false,
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("quarantine", &self.shared.quarantine)
            .field("loaded", &self.shared.loaded.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Keeper {
    /// A keeper deciding by `quarantine`. It queues failures at once and writes them
    /// once [`start`](Self::start)ed.
    #[must_use]
    pub fn new(quarantine: Quarantine) -> Arc<Self> {
        let (jobs, receiver) = mpsc::sync_channel(QUEUE);
        let (loaded_tx, _) = tokio::sync::watch::channel(false);
        Arc::new(Self {
            shared: Arc::new(Shared {
                quarantine,
                ledger: RwLock::new(Ledger::new()),
                loaded: AtomicBool::new(false),
                loaded_tx,
                gave_up: AtomicBool::new(false),
                identities: RwLock::default(),
                announced: Mutex::default(),
                warned: Mutex::default(),
                stop: AtomicBool::new(false),
                overflow: Mutex::default(),
                turned_away: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                #[cfg(feature = "metrics")]
                metrics: OnceLock::new(),
            }),
            jobs,
            receiver: Mutex::new(Some(receiver)),
            recorded: Mutex::default(),
            thread: Mutex::new(None),
        })
    }

    /// The decision it keeps.
    #[must_use]
    pub fn quarantine(&self) -> Quarantine {
        self.shared.quarantine
    }

    /// Starts its thread: it reads the ledger from `store`, then records each liveness
    /// failure into it and reads it again now and then. Does nothing when started.
    pub fn start(&self, store: impl Store) -> Result<(), Error> {
        let Some(jobs) = self
            .receiver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Ok(());
        };
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("quarantine".into())
            .spawn(move || run(&shared, store, &jobs))
            .map_err(Error::Spawn)?;
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok(())
    }

    /// Says how to find the uid and generation of `controller`'s objects (the kube
    /// integration asks its cache), recorded beside their failures.
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))]
    pub(crate) fn identify(
        &self,
        controller: &str,
        lookup: impl Fn(&ObjectKey) -> Option<(Option<String>, Option<i64>)> + Send + Sync + 'static,
    ) {
        self.shared
            .identities
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(controller.to_owned(), Box::new(lookup));
    }

    /// Waits until the ledger has been read once (or could not be), at most 10
    /// seconds, and only the first time: a reconcile must not run before the ledger
    /// that may quarantine it is known.
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))]
    pub(crate) async fn loaded(&self) {
        if self.shared.loaded.load(Ordering::Acquire) || self.shared.gave_up.load(Ordering::Relaxed)
        {
            return;
        }
        let mut loaded = self.shared.loaded_tx.subscribe();
        if tokio::time::timeout(LOAD_WAIT, loaded.wait_for(|l| *l))
            .await
            .is_err()
            && !self.shared.gave_up.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(target: TARGET, "the quarantine ledger was not read within {}; reconciling without it until it is", fmt_duration(LOAD_WAIT));
        }
    }

    /// Reads the ledger again before the next reconcile is admitted: a new leader calls
    /// it as it starts its controllers, for what the old one wrote (`Controllers::run`
    /// does). Before the first read, it does nothing: that read is coming.
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))]
    pub(crate) fn reload(&self) {
        if !self.shared.loaded.swap(false, Ordering::AcqRel) {
            return;
        }
        self.shared.loaded_tx.send_replace(false);
        if !self.send_or_keep(Job::Reload) {
            // Nothing will read it: do not make reconciles wait for it.
            self.shared.loaded.store(true, Ordering::Release);
            self.shared.loaded_tx.send_replace(true);
        }
    }

    /// Whether `subject` (an object of kind `kind`) may be reconciled at `now`. The
    /// first time this process finds it quarantined, it logs one WARN and counts it;
    /// when its quarantine ends, one INFO, and its entry is forgotten.
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))]
    pub(crate) fn admit(&self, subject: &Subject<'_>, kind: &str, now: SystemTime) -> Admission {
        let quarantine = self.shared.quarantine;
        let standing = {
            let ledger = self.shared.ledger.read().unwrap_or_else(|p| p.into_inner());
            quarantine.judge(&ledger, subject, now)
        };
        let key = (subject.controller.to_owned(), subject.object.to_owned());
        match standing {
            Standing::Free => {
                let was = self.unannounce(&key);
                Admission::Reconcile {
                    lifted: was.then(|| self.announce_lift(subject, kind, Lift::Removed)),
                }
            }
            Standing::Lifted { why, latest } => {
                self.unannounce(&key);
                self.shared
                    .ledger
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .forget(subject.controller, subject.object, latest);
                self.send_or_keep(Job::Forget {
                    controller: key.0,
                    object: key.1,
                    latest,
                });
                Admission::Reconcile {
                    lifted: Some(self.announce_lift(subject, kind, why)),
                }
            }
            Standing::Quarantined {
                since,
                until,
                count,
            } => {
                let remaining = until.duration_since(now).unwrap_or_default();
                let first = {
                    let mut announced = self
                        .shared
                        .announced
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    announced.insert(key, since) != Some(since)
                };
                let announced = first.then(|| {
                    self.announce_quarantine(subject, kind, since, until, count, remaining)
                });
                Admission::Skip {
                    requeue: remaining.min(RECHECK_EVERY),
                    announced,
                }
            }
        }
    }

    /// The objects this process found quarantined, per controller.
    #[must_use]
    pub(crate) fn quarantined(&self) -> Vec<(String, String)> {
        let announced = self
            .shared
            .announced
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = announced.keys().cloned().collect();
        all.sort();
        all
    }

    /// How many objects this process found quarantined, and the first
    /// [`QUARANTINED_NAMED`] of them by controller and name (`controller
    /// namespace/name`): what the debug views show, bounded however many there are.
    #[must_use]
    pub(crate) fn quarantined_named(&self) -> (usize, Vec<String>) {
        let all = self.quarantined();
        let named = all
            .iter()
            .take(QUARANTINED_NAMED)
            .map(|(controller, object)| format!("{controller} {object}"))
            .collect();
        (all.len(), named)
    }

    /// The ledger as last read or written.
    #[must_use]
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn ledger(&self) -> Ledger {
        self.shared
            .ledger
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes of the ledger so far (each a read-modify-write that landed).
    #[must_use]
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn writes(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// The metrics to count quarantines in.
    #[cfg(feature = "metrics")]
    pub(crate) fn attach_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.shared.metrics.set(metrics);
        // The ledger may have been read already.
        let ledger = self.shared.ledger.read().unwrap_or_else(|p| p.into_inner());
        publish_recorded(&self.shared, &ledger);
    }

    /// Forgets that `key` was announced; whether it was.
    fn unannounce(&self, key: &(String, String)) -> bool {
        let was = self
            .shared
            .announced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
            .is_some();
        if was {
            self.count_quarantined(&key.0);
        }
        was
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn count_quarantined(&self, controller: &str) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self.shared.metrics.get() {
            let now = self
                .shared
                .announced
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .filter(|(c, _)| c == controller)
                .count();
            metrics.set_quarantined(controller, now);
        }
    }

    fn announce_quarantine(
        &self,
        subject: &Subject<'_>,
        kind: &str,
        since: SystemTime,
        until: SystemTime,
        count: u32,
        remaining: Duration,
    ) -> Announcement {
        let (controller, object) = (subject.controller, subject.object);
        let (since, until) = (rfc3339(since), rfc3339(until));
        tracing::warn!(
            target: TARGET,
            controller,
            object,
            kind,
            failures = count,
            since = %since,
            until = %until,
            "reconcile quarantined: {controller} {object} caused {count} liveness failures; not reconciled until {until} ({} from now) unless its spec changes, it is re-created or the {LIFT_ANNOTATION} annotation is set",
            fmt_duration(remaining),
        );
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self.shared.metrics.get() {
            metrics.quarantine_started(controller);
        }
        self.count_quarantined(controller);
        Announcement {
            reason: "ReconcileQuarantined",
            warning: true,
            note: format!(
                "not reconciled by {controller}: its reconcile hung and failed the operator's liveness {count} times; quarantined since {since} until {until}; lifted when its spec changes, when it is re-created, or with the annotation {LIFT_ANNOTATION}"
            ),
        }
    }

    fn announce_lift(&self, subject: &Subject<'_>, kind: &str, why: Lift) -> Announcement {
        let (controller, object) = (subject.controller, subject.object);
        tracing::info!(target: TARGET, controller, object, kind, why = why.as_str(), "quarantine lifted: {controller} {object}: {why}; reconciling it");
        Announcement {
            reason: "ReconcileQuarantineLifted",
            warning: false,
            note: format!("quarantine lifted: {why}; reconciled by {controller} again"),
        }
    }

    /// Hands `job` to the thread if the queue has room; whether it had.
    fn send(&self, job: Job) -> bool {
        match self.jobs.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.turned_away.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Hands `job` to the thread, or keeps it aside for the thread's next batch when
    /// the queue is full (a newer forgetting of the same entry, or a second reload,
    /// replaces the one kept). False only when the thread is gone.
    fn send_or_keep(&self, job: Job) -> bool {
        let job = match self.jobs.try_send(job) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(job)) => job,
        };
        self.shared.turned_away.fetch_add(1, Ordering::Relaxed);
        {
            let mut overflow = self
                .shared
                .overflow
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            overflow.retain(|kept| !job.replaces(kept));
            overflow.push(job);
        }
        // The thread drains the queue before it takes what was kept aside: a full queue
        // wakes it anyway; if it drained in between, this wakes it.
        let _ = self.jobs.try_send(Job::Wake);
        true
    }
}

/// The annotation that lifts an object's quarantine while it is set.
pub const LIFT_ANNOTATION: &str = "reconcile-watchdog.dev/lift-quarantine";

impl Observer for Keeper {
    /// Hands each reconcile newly failing liveness to the thread, without waiting.
    fn scanned(&self, scan: &Scan<'_>) {
        // Only the monitor thread takes this lock: never contended.
        let Ok(mut recorded) = self.recorded.try_lock() else {
            return;
        };
        let failing: HashSet<u64> = scan
            .decision
            .overdue
            .iter()
            .filter(|o| o.fails_liveness)
            .map(|o| o.reconcile.id)
            .collect();
        recorded.retain(|id, _| failing.contains(id));
        let own_frame = |id: u64| {
            scan.own_frames
                .iter()
                .find(|(of, _)| *of == id)
                .map(|(_, frame)| frame.clone())
        };
        // A failure recorded before its stack was captured gets its frame when it is.
        let mut frames = Vec::new();
        for (id, late) in recorded.iter() {
            if frames.len() == PER_SCAN {
                break;
            }
            if let Some(late) = late
                && let Some(frame) = own_frame(*id)
            {
                frames.push((
                    *id,
                    LateFrame {
                        frame,
                        ..late.clone()
                    },
                ));
            }
        }
        let now = SystemTime::now();
        let mut failures = Vec::new();
        let mut ids = Vec::new();
        for overdue in scan.decision.overdue.iter().filter(|o| o.fails_liveness) {
            if failures.len() == PER_SCAN {
                break;
            }
            let reconcile = overdue.reconcile;
            if recorded.contains_key(&reconcile.id) {
                continue;
            }
            let frame = own_frame(reconcile.id);
            let late = frame.is_none().then(|| LateFrame {
                controller: reconcile.controller.to_string(),
                object: reconcile.object.as_str().to_owned(),
                at: now,
                frame: String::new(),
            });
            recorded.insert(reconcile.id, late);
            ids.push(reconcile.id);
            let action = if reconcile.cancel_requested {
                "escalated"
            } else {
                "restart"
            };
            failures.push(Failure {
                controller: reconcile.controller.to_string(),
                kind: reconcile.kind.to_string(),
                object: reconcile.object.as_str().to_owned(),
                uid: None,
                generation: None,
                hang: Hang {
                    state: overdue.state.as_str().to_owned(),
                    waiting: reconcile.waiting().map(|w| w.to_string()),
                    frame,
                    action: action.to_owned(),
                },
                at: now,
            });
        }
        if failures.is_empty() && frames.is_empty() {
            return;
        }
        let frame_ids: Vec<u64> = frames.iter().map(|(id, _)| *id).collect();
        let frames = frames.into_iter().map(|(_, late)| late).collect();
        if self.send(Job::Failed(failures, frames)) {
            for id in frame_ids {
                recorded.insert(id, None);
            }
        } else {
            // A full queue loses nothing: the new failures and the frames are handed on
            // again at the next scan.
            recorded.retain(|id, _| !ids.contains(id));
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            // The thread writes what is queued, then ends; a write ends within the
            // store's own timeout.
            let _ = self.jobs.try_send(Job::Wake);
            let _ = thread.join();
        }
    }
}

/// The thread: read, then record failures as they come and read again now and then.
fn run(shared: &Shared, mut store: impl Store, jobs: &Receiver<Job>) {
    if let Some(ledger) = read(shared, &mut store) {
        adopt(shared, ledger);
    }
    shared.loaded.store(true, Ordering::Release);
    shared.loaded_tx.send_replace(true);
    loop {
        let first = match jobs.recv_timeout(REFRESH_EVERY) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => {
                if let Some(ledger) = read(shared, &mut store) {
                    adopt(shared, ledger);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // One write for every job waiting: a liveness failure of several objects at
        // once is one write.
        let mut batch: Vec<Job> = std::iter::once(first).chain(jobs.try_iter()).collect();
        batch.append(&mut shared.overflow.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.iter().any(|job| matches!(job, Job::Reload)) {
            if let Some(ledger) = read(shared, &mut store) {
                adopt(shared, ledger);
            }
            shared.loaded.store(true, Ordering::Release);
            shared.loaded_tx.send_replace(true);
        }
        batch.retain(|job| !matches!(job, Job::Wake | Job::Reload));
        if !batch.is_empty() {
            write(shared, &mut store, batch);
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Makes `ledger`, as read, the one in memory, and its count of failures the metric's:
/// a restarted process exports what its predecessors recorded from its first read.
fn adopt(shared: &Shared, ledger: Ledger) {
    let mut memory = shared.ledger.write().unwrap_or_else(|p| p.into_inner());
    *memory = ledger;
    publish_recorded(shared, &memory);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn publish_recorded(shared: &Shared, ledger: &Ledger) {
    #[cfg(feature = "metrics")]
    if let Some(metrics) = shared.metrics.get() {
        metrics.set_quarantine_recorded(ledger.recorded);
    }
}

/// The stored ledger, or None when there is none or it cannot be read (logged once).
fn read(shared: &Shared, store: &mut impl Store) -> Option<Ledger> {
    match store.read() {
        // Nothing stored (deleted by hand, say) is an empty ledger.
        Ok(stored) => match stored.bytes.map(|bytes| Ledger::decode(&bytes)) {
            None => Some(Ledger::new()),
            Some(Ok(ledger)) => Some(ledger),
            Some(Err(error)) => {
                warn_once(shared, "decode", &error);
                None
            }
        },
        Err(error) => {
            warn_once(shared, store_error_kind(&error), &error);
            None
        }
    }
}

fn store_error_kind(error: &StoreError) -> &'static str {
    match error {
        StoreError::Conflict => "conflict",
        StoreError::Forbidden(_) => "forbidden",
        StoreError::Failed(_) => "failed",
    }
}

fn warn_once(shared: &Shared, kind: &'static str, error: &dyn std::error::Error) {
    let first = shared
        .warned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(kind);
    let error = chain(error);
    if first {
        tracing::warn!(target: TARGET, error = %error, "the quarantine ledger could not be read or written; ignored (said once)");
    } else {
        tracing::debug!(target: TARGET, error = %error, "the quarantine ledger could not be read or written");
    }
}

/// Applies `batch` to the stored ledger, a read-modify-write retried on conflict, and
/// to the one in memory whatever the store says.
fn write(shared: &Shared, store: &mut impl Store, mut batch: Vec<Job>) {
    let quarantine = shared.quarantine;
    identify(shared, &mut batch);
    let began = Instant::now();
    let apply = |ledger: &mut Ledger| {
        let now = SystemTime::now();
        for job in &batch {
            match job {
                Job::Failed(failures, frames) => {
                    for failure in failures {
                        quarantine.record(ledger, failure.clone(), now);
                    }
                    for late in frames {
                        ledger.late_frame(late);
                    }
                }
                Job::Forget {
                    controller,
                    object,
                    latest,
                } => {
                    ledger.forget(controller, object, *latest);
                }
                Job::Reload | Job::Wake => {}
            }
        }
        quarantine.prune(ledger, now);
    };
    let mut written = None;
    for _ in 0..CONFLICT_TRIES {
        let stored = match store.read() {
            Ok(stored) => stored,
            Err(error) => {
                warn_once(shared, store_error_kind(&error), &error);
                break;
            }
        };
        // A ledger that cannot be read is replaced by a new one.
        let mut ledger = stored
            .bytes
            .as_deref()
            .and_then(|bytes| Ledger::decode(bytes).ok())
            .unwrap_or_else(Ledger::new);
        apply(&mut ledger);
        let bytes = ledger.encode();
        match store.write(&bytes, stored.version.as_deref()) {
            Ok(()) => {
                shared.writes.fetch_add(1, Ordering::Relaxed);
                written = Some((ledger, bytes.len()));
                break;
            }
            Err(StoreError::Conflict) => {}
            Err(error) => {
                warn_once(shared, store_error_kind(&error), &error);
                break;
            }
        }
    }
    let mut memory = shared.ledger.write().unwrap_or_else(|p| p.into_inner());
    match written {
        Some((ledger, bytes)) => {
            *memory = ledger;
            let failures = batch.iter().flat_map(|job| match job {
                Job::Failed(failures, _) => failures.as_slice(),
                _ => Default::default(),
            });
            for failure in failures {
                let count = memory
                    .entry(&failure.controller, &failure.object)
                    .map_or(0, |e| e.count);
                let since_failure = SystemTime::now()
                    .duration_since(failure.at)
                    .unwrap_or_default();
                tracing::info!(
                    target: TARGET,
                    controller = %failure.controller,
                    object = %failure.object,
                    failures = count,
                    bytes,
                    took = %fmt_duration(since_failure),
                    "recorded the liveness failure of {} {} in the quarantine ledger ({count} in all)",
                    failure.controller,
                    failure.object,
                );
            }
            tracing::debug!(target: TARGET, took = %fmt_duration(began.elapsed()), "quarantine ledger written");
        }
        None => apply(&mut memory),
    }
    publish_recorded(shared, &memory);
}

/// Fills in the uid and generation of each failure from its controller's cache.
fn identify(shared: &Shared, batch: &mut [Job]) {
    let identities = shared.identities.read().unwrap_or_else(|p| p.into_inner());
    let failures = batch.iter_mut().flat_map(|job| match job {
        Job::Failed(failures, _) => failures.as_mut_slice(),
        _ => Default::default(),
    });
    for failure in failures {
        if let Some(lookup) = identities.get(&failure.controller)
            && let Some((uid, generation)) = lookup(&object_key(&failure.object))
        {
            failure.uid = uid;
            failure.generation = generation;
        }
    }
}

fn object_key(object: &str) -> ObjectKey {
    match object.split_once('/') {
        Some((namespace, name)) => ObjectKey::namespaced(namespace, name),
        None => ObjectKey::cluster(object),
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// An error and its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
impl Keeper {
    /// Whether the thread has read the ledger once.
    pub(crate) fn shared_loaded(&self) -> bool {
        self.shared.loaded.load(Ordering::Acquire)
    }

    /// Marks `object` of `controller` as found quarantined, as an admission would.
    pub(crate) fn announce_for_test(&self, controller: &str, object: &str) {
        self.shared
            .announced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (controller.to_owned(), object.to_owned()),
                SystemTime::now(),
            );
    }

    /// Hands `failures` to the thread, as one scan would; whether the queue had room.
    pub(crate) fn record_for_test(&self, failures: Vec<Failure>) -> bool {
        self.send(Job::Failed(failures, Vec::new()))
    }
}
