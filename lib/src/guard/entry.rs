//! One in-flight reconcile: what is fixed at registration and what each poll updates.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, TryLockError};
use std::time::{Duration, Instant, SystemTime};

use futures::task::AtomicWaker;

use super::clock;
use super::controller::Controller;
use super::reconcile::{InFlight, ObjectKey, PollState};
use super::state::StateWord;
pub(crate) use super::state::{KEY_MASK, State, key_of};
use super::thread;
use super::waits::FactsCell;

/// The shared record of one reconcile, kept in the registry's map for as long as the
/// entry lives: an entry whose reconcile ended unshared stays there, idle, as its
/// thread's spare, and holds that thread's next reconcile of the same controller
/// (registering it then costs no map insertion, and ending it no removal). Written by
/// the task that polls it, read by the monitor; every mutable field but the object is
/// an atomic, so neither side takes a lock on the common path.
pub(crate) struct Entry {
    /// Name, kind, deadline and registry, shared by every reconcile of the controller:
    /// one reference count per reconcile instead of one per field. Fixed for the entry's
    /// life: a spare holds only reconciles of its controller.
    pub(crate) controller: Arc<Controller>,
    /// The latest reconcile's id and whether it runs, was reported hung, was asked to
    /// stop ([`State`]); readers copy the entry under its seqlock protocol.
    state: StateWord,
    /// The object of the latest reconcile. A lock, not an atomic: a reader clones it
    /// while the next reconcile may be replacing it (uncontended: about 15 instructions
    /// a registration). Readers share it and only ever try it (see
    /// [`try_object`](Entry::try_object)); its one writer is the reuse of an idle entry.
    object: RwLock<ObjectKey>,
    /// When the latest reconcile started on the monotonic clock ([`clock`]), in
    /// nanoseconds. Written before the state word publishes the reconcile.
    started: AtomicU64,
    /// The instant `poll` counts from (the registry's epoch).
    epoch: Epoch,
    polls: AtomicU64,
    /// The latest poll in one word, so that a poll's end needs no clock read: bit 0 is
    /// set while it runs; the bits above hold when it began, stamped (see
    /// [`stamp_now`](Self::stamp_now); 0 before the first poll).
    poll: AtomicU64,
    thread: AtomicU64,
    /// The tokio task of the first poll: a pinned future stays in the task that polls it.
    task_id: AtomicU64,
    /// When the reconcile was first woken since its latest poll began, stamped as
    /// `poll` is (0: not since). Set by the waker the guard hands the reconcile.
    woken: AtomicU64,
    /// A third reference is held for lending to the thread during polls.
    lent: AtomicBool,
    waker: AtomicWaker,
    /// What it waits on: requests in flight and the innermost label, written off the
    /// common path (see `waits`).
    pub(crate) facts: FactsCell,
}

/// The strong references to an entry while its `Guarded` future lives: the registry's
/// slot and the guard, and a third when the entry is lent to the thread during polls
/// (see `Entry::lent`). Every further one is a clone of the guard's waker held by
/// whatever the reconcile waits on (or a passing reader's, which only ever hides a lost
/// waker for one scan, never invents one).
const HELD_WITHOUT_WAKERS: usize = 2;

impl Entry {
    /// A new entry of a reconcile that started at `started` ([`clock::now`]), not yet
    /// running: [`begin`](Self::begin) gives it its id once it has a key in the map.
    pub(crate) fn new(
        controller: Arc<Controller>,
        object: ObjectKey,
        epoch: Epoch,
        started: u64,
    ) -> Self {
        Self {
            controller,
            state: StateWord::new(),
            object: RwLock::new(object),
            started: AtomicU64::new(started),
            epoch,
            polls: AtomicU64::new(0),
            poll: AtomicU64::new(0),
            thread: AtomicU64::new(0),
            task_id: AtomicU64::new(0),
            woken: AtomicU64::new(0),
            lent: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            facts: FactsCell::new(),
        }
    }

    /// Publishes reconcile `id` as running: a registration's last write.
    pub(crate) fn begin(&self, id: u64) {
        self.state.begin(id);
    }

    /// The id this idle entry's next reconcile would get; `None` when its ids are used
    /// up (then it leaves the map and a fresh entry takes over).
    #[inline]
    pub(crate) fn next_reconcile(&self) -> Option<u64> {
        self.state.load().next_id()
    }

    /// The key of its slot in the registry's map.
    pub(crate) fn key(&self) -> u64 {
        key_of(self.state.load().id())
    }

    /// Makes this idle spare the entry of reconcile `id` (its
    /// [`next_reconcile`](Self::next_reconcile)) of `object`, started at `started`. Only
    /// the spare's thread calls it.
    ///
    /// A reader may be looking at the entry meanwhile: every field is reset before the
    /// state word publishes the new id, and a reader that read the old state first
    /// finds it changed after and discards what it read ([`StateWord::republish`]).
    #[inline]
    pub(crate) fn reuse(&self, id: u64, object: ObjectKey, started: u64) {
        self.state.republish(id, || {
            // The ended reconcile's object is dropped after the lock is released.
            let _ended = std::mem::replace(
                &mut *self.object.write().unwrap_or_else(|p| p.into_inner()),
                object,
            );
            self.started.store(started, Ordering::Relaxed);
            self.polls.store(0, Ordering::Relaxed);
            self.poll.store(0, Ordering::Relaxed);
            self.thread.store(0, Ordering::Relaxed);
            self.task_id.store(0, Ordering::Relaxed);
            self.woken.store(0, Ordering::Relaxed);
            self.lent.store(false, Ordering::Relaxed);
        });
    }

    /// Ends the running reconcile (it is no longer in flight for any reader), and
    /// returns its state as it was: whether the monitor had reported it hung.
    #[inline]
    pub(crate) fn end(&self) -> State {
        self.state.end()
    }

    /// The state word now.
    #[inline]
    pub(crate) fn state(&self) -> State {
        self.state.load()
    }

    /// Marks reconcile `id` reported hung, if it is still running; returns whether it
    /// was (then its end finds the mark).
    pub(crate) fn mark_reported_hung(&self, id: u64) -> bool {
        self.state.set_flag(id, State::HUNG)
    }

    /// The object of the latest reconcile, for its own thread, which is the only one
    /// that replaces it: it never waits for a writer, only (briefly) for none.
    pub(crate) fn object(&self) -> RwLockReadGuard<'_, ObjectKey> {
        self.object.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The object of the latest reconcile, for a reader on another thread: `None` while
    /// the entry's thread is replacing it for its next reconcile (a copy that would have
    /// been dropped anyway), so that a reader never waits for a reconcile's thread.
    /// Readers share the lock; none keeps another out.
    fn try_object(&self) -> Option<ObjectKey> {
        match self.object.try_read() {
            Ok(object) => Some(object.clone()),
            Err(TryLockError::Poisoned(object)) => Some(object.into_inner().clone()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Holds the object as the reuse of the entry does, for a test to park a thread
    /// there.
    #[cfg(test)]
    pub(crate) fn hold_object_as_reuse_does(&self) -> std::sync::RwLockWriteGuard<'_, ObjectKey> {
        self.object.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets go of what the ended reconcile left that holds anything else alive: the
    /// facts' requests.
    ///
    /// The task's waker stays registered: the thread's next reconcile is most often
    /// polled by the same task (kube's controller polls all of its reconciles in one),
    /// whose waker then needs no clone, only a comparison (about 20 instructions
    /// saved). Until then, a cancel request could only wake that task spuriously; a
    /// wake or cancel of the next reconcile before it registers its own task's waker
    /// leaves its mark, which the poll checks after registering.
    #[inline]
    pub(crate) fn clear(&self) {
        self.facts.clear();
    }

    /// When it started, as an `Instant`.
    pub(crate) fn started_at(&self) -> Instant {
        self.epoch.instant(self.started())
    }

    /// When it started ([`clock`]).
    #[inline]
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::Acquire)
    }

    /// How long it has run, read now.
    pub(crate) fn elapsed(&self) -> Duration {
        Duration::from_nanos(clock::now().saturating_sub(self.started()))
    }

    /// Now, for a poll's or a wake's record: the coarse clock's reading with its lowest
    /// bit set, which keeps 0 free to mean "never" (a nanosecond off). These times only
    /// date reports, whose deadlines are seconds to minutes; the start, the end and
    /// every deadline decision read the precise clock. Taken relative to the epoch only
    /// when read ([`instant`](Self::instant)), off the poll's path.
    #[inline]
    fn stamp_now() -> u64 {
        // The monotonic clock counts from boot: 63 bits of nanoseconds last 292 years.
        clock::coarse_now() | 1
    }

    /// The instant of `stamp`, kept between the start and `now`: the coarse clock's
    /// reading and the epoch's may each be up to a tick old.
    fn instant(&self, stamp: u64, now: Instant) -> Option<Instant> {
        (stamp != 0).then(|| {
            (self.epoch.precise + Duration::from_nanos(stamp.saturating_sub(self.epoch.coarse)))
                .min(now)
                .max(self.started_at())
        })
    }

    /// Records the start of a poll: a handful of relaxed stores and one coarse clock
    /// read.
    #[inline]
    pub(crate) fn poll_begins(&self) {
        // Only the task polling the reconcile writes these (a poll holds it by `&mut`),
        // so a load and a store do what a read-modify-write would, for less.
        let polls = self.polls.load(Ordering::Relaxed);
        if polls == 0 {
            self.task_id
                .store(thread::current_task_id(), Ordering::Relaxed);
        }
        // Every poll, the first included, is dated by its own start: a first poll may
        // come long after registration (kube's runner and `tokio::spawn` queue the
        // future first), and that queueing is no time spent in a poll.
        let began = Self::stamp_now();
        // The thread first, then the count, then the stamp, each published by the
        // next: a reader that sees a poll's count sees its thread, so a stack captured
        // from that thread while the count stays the same and the poll runs is this
        // poll's (the monitor checks both after a capture).
        self.thread.store(thread::current_slot(), Ordering::Relaxed);
        self.polls.store(polls + 1, Ordering::Release);
        self.poll.store(began << 1 | 1, Ordering::Release);
        // Woken before this poll began: this poll is what the wake asked for.
        self.woken.store(0, Ordering::Relaxed);
    }

    /// Remembers the waker of the task that polls the reconcile, so that a wake of the
    /// guard's own waker (see [`Wake`](std::task::Wake) below) and a cancel request
    /// reach it.
    #[inline]
    pub(crate) fn register_waker(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }

    /// Whether the guard's waker was woken since the latest poll began.
    #[inline]
    pub(crate) fn woken_since_poll_began(&self) -> bool {
        self.woken.load(Ordering::Acquire) != 0
    }

    /// Records the end of a poll: the in-poll bit cleared, its start kept.
    #[inline]
    pub(crate) fn poll_ends(&self) {
        let poll = self.poll.load(Ordering::Relaxed);
        self.poll.store(poll & !1, Ordering::Release);
    }

    /// Whether a poll is under way.
    pub(crate) fn in_poll(&self) -> bool {
        self.poll.load(Ordering::Acquire) & 1 == 1
    }

    #[inline]
    pub(crate) fn cancel_requested(&self) -> bool {
        self.state().is_cancelled()
    }

    /// Asks reconcile `id` to stop at its next poll, and wakes it so that poll comes;
    /// false when it has ended (the entry may hold another reconcile by now).
    pub(crate) fn request_cancel(&self, id: u64) -> bool {
        if !self.state.set_flag(id, State::CANCEL) {
            return false;
        }
        self.waker.wake();
        true
    }

    /// Counts a third reference as held (see [`HELD_WITHOUT_WAKERS`]).
    pub(crate) fn lent(&self) {
        self.lent.store(true, Ordering::Relaxed);
    }

    /// A plain-data copy of the entry registered as `id`, taken alone by the entry's own
    /// thread (the only one that replaces its object).
    pub(crate) fn snapshot(self: &Arc<Self>, id: u64) -> InFlight {
        let object = self.object().clone();
        self.copy(
            id,
            object,
            &Clocks::now(),
            &mut thread::InfoCache::default(),
        )
    }

    /// A copy of reconcile `id`, taken alone, while it runs.
    pub(crate) fn snapshot_of(self: &Arc<Self>, id: u64) -> Option<InFlight> {
        self.snapshot_running(&Clocks::now(), &mut thread::InfoCache::default())
            .filter(|copy| copy.id == id)
    }

    /// A copy of the running reconcile, or `None` when the entry is idle, or when its
    /// reconcile ended while it was copied (another may have begun: the copy could mix
    /// the two), or when its thread is replacing the object for the next one (a reader
    /// never waits for it). A copy dropped here is taken again at the next scan.
    pub(crate) fn snapshot_running(
        self: &Arc<Self>,
        clocks: &Clocks,
        threads: &mut thread::InfoCache,
    ) -> Option<InFlight> {
        self.state
            .read_running(|id| Some(self.copy(id, self.try_object()?, clocks, threads)))
    }

    /// A plain-data copy for the monitor and the debug view, one of many taken at
    /// `clocks`, sharing `threads` so that each thread is looked up once per scan.
    fn copy(
        self: &Arc<Self>,
        id: u64,
        object: ObjectKey,
        clocks: &Clocks,
        threads: &mut thread::InfoCache,
    ) -> InFlight {
        // Counted before the poll state is read: a waker that wakes dates the wake
        // before its reference goes (a release the fence pairs with), so a count that
        // shows no waker left is never read beside a state from before that wake.
        let held = HELD_WITHOUT_WAKERS + usize::from(self.lent.load(Ordering::Relaxed));
        let wakers_gone = Arc::strong_count(self) <= held;
        std::sync::atomic::fence(Ordering::Acquire);
        let started = self.started_at();
        let latest = self.poll.load(Ordering::Acquire);
        let began = self.instant(latest >> 1, clocks.now);
        let poll = match began {
            Some(since) if latest & 1 == 1 => PollState::InPoll { since },
            _ => match self.instant(self.woken.load(Ordering::Acquire), clocks.now) {
                Some(since) => PollState::Woken { since },
                None => PollState::Awaiting,
            },
        };
        let task_id = self.task_id.load(Ordering::Relaxed);
        let polls = self.polls.load(Ordering::Acquire);
        let (request, label) = self.facts.read(clocks.now).unwrap_or_default();
        InFlight {
            id,
            controller: Arc::clone(&self.controller.name),
            kind: Arc::clone(&self.controller.kind),
            object,
            deadline: self.controller.deadline,
            started,
            // Dated on the wall clock here rather than at registration, which saves the
            // hot path a clock read.
            started_at: clocks
                .wall
                .checked_sub(clocks.now.saturating_duration_since(started))
                .unwrap_or(clocks.wall),
            // Read after the stamp and before the thread: see `poll_begins`.
            polls,
            no_waker: wakers_gone && polls > 0 && poll == PollState::Awaiting,
            request,
            label,
            poll,
            last_poll_began: began,
            thread: threads.info(self.thread.load(Ordering::Relaxed)),
            task_id: (task_id != 0).then_some(task_id),
            cancel_requested: self.cancel_requested(),
        }
    }
}

/// The guard's waker: the reconcile is polled with it, so a wake is dated (once per
/// poll, on the waking side) before it is passed on to the task's own waker. A
/// reconcile woken but not polled since is a victim of whatever keeps its executor
/// from polling it, not an await that never woke.
impl futures::task::ArcWake for Entry {
    fn wake_by_ref(entry: &Arc<Self>) {
        if entry.woken.load(Ordering::Relaxed) == 0 {
            let _ = entry.woken.compare_exchange(
                0,
                Self::stamp_now(),
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
        entry.waker.wake();
    }
}

/// The registry's epoch as an `Instant`, a [`clock`] reading and a coarse one, read
/// together.
#[derive(Clone, Copy)]
pub(crate) struct Epoch {
    precise: Instant,
    /// The same instant as a [`clock::now`] reading.
    nanos: u64,
    /// The same instant as a [`clock::coarse_now`] reading (up to a tick earlier).
    coarse: u64,
}

impl Epoch {
    pub(crate) fn now() -> Self {
        Self {
            precise: Instant::now(),
            nanos: clock::now(),
            coarse: clock::coarse_now(),
        }
    }

    /// The `Instant` of a [`clock`] reading taken after the epoch.
    pub(crate) fn instant(&self, nanos: u64) -> Instant {
        self.precise + Duration::from_nanos(nanos.saturating_sub(self.nanos))
    }

    /// The [`clock`] reading of an `Instant`, which may be before the epoch (then its
    /// reading is the epoch's less the difference, or 0).
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.precise) {
            Some(after) => self
                .nanos
                .saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX)),
            None => self.nanos.saturating_sub(
                u64::try_from(self.precise.duration_since(at).as_nanos()).unwrap_or(u64::MAX),
            ),
        }
    }
}

/// The monotonic and wall clocks, read together once for a whole snapshot.
pub(crate) struct Clocks {
    now: Instant,
    wall: SystemTime,
}

impl Clocks {
    pub(crate) fn now() -> Self {
        Self::at(Instant::now())
    }

    /// `now`, with the wall clock read beside it.
    pub(crate) fn at(now: Instant) -> Self {
        Self {
            now,
            wall: SystemTime::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The state word's steps one at a time (its races: the loom model, `tests/loom.sh`).
    use super::super::state::{
        KEY_BITS, KEY_MASK, LAST_GENERATION, State, StateWord, key_of, next_id,
    };

    #[test]
    fn an_entrys_ids_keep_its_key_and_run_out_before_the_state_word_does() {
        let first = KEY_MASK;
        let second = next_id(first).expect("room for a second");
        assert_eq!(key_of(second), KEY_MASK);
        assert_ne!(second, first);

        let last = KEY_MASK | LAST_GENERATION << KEY_BITS;
        assert_eq!(next_id(last), None, "the last generation has no successor");
        assert_eq!(next_id(last - (1 << KEY_BITS)), Some(last));
        // The last id and every flag fit the word.
        let word = StateWord::new();
        word.begin(last);
        assert!(word.set_flag(last, State::HUNG) && word.set_flag(last, State::CANCEL));
        let state = word.load();
        assert_eq!(state.id(), last);
        assert!(state.is_active() && state.is_hung() && state.is_cancelled());
        let ended = state.ended();
        assert_eq!(ended.id(), last);
        assert!(!ended.is_active() && !ended.is_hung() && !ended.is_cancelled());
    }

    #[test]
    fn flags_land_only_on_the_reconcile_they_name() {
        let word = StateWord::new();
        word.begin(7);
        assert!(!word.set_flag(6, State::HUNG), "another reconcile");
        assert!(word.set_flag(7, State::HUNG));
        let ended = word.end();
        assert!(ended.is_hung() && ended.id() == 7);
        assert!(!word.set_flag(7, State::CANCEL), "ended");
        let next = ended.next_id().expect("room");
        word.republish(next, || {});
        assert!(!word.load().is_hung(), "the flag stayed with its reconcile");
        assert_eq!(word.read_running(Some), Some(next));
        assert_eq!(
            word.read_running(|_| None::<u64>),
            None,
            "a copy that gave up"
        );
        word.end();
        assert_eq!(word.read_running(Some), None, "idle");
    }
}
