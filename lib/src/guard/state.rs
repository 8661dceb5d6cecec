//! The state word of a registry entry: which reconcile it holds, and the seqlock protocol by which readers copy it.
//!
//! An entry is reused: the reconcile that ends on it leaves it idle in the map, and its
//! thread's next reconcile of the same controller takes it over. One atomic word per
//! entry names the reconcile it holds (an id) and says whether that reconcile runs, was
//! reported hung, was asked to stop. Every step on it names the reconcile, so none can
//! land on the entry's next one:
//!
//! - the owner [`begin`](StateWord::begin)s a reconcile, [`end`](StateWord::end)s it, and
//!   [`republish`](StateWord::republish)es the idle entry for its next one, writing the
//!   entry's fields before the word publishes the new id;
//! - the monitor [`set_flag`](StateWord::set_flag)s (hung, cancel) on the reconcile it
//!   names, only while that one runs;
//! - readers [`read_running`](StateWord::read_running): a seqlock's read, kept only when
//!   the same reconcile still runs after the copy.
//!
//! The atomics come from `super::sync`: std's here. The loom model of this protocol
//! (`lib/tests/loom.rs`, run by `tests/loom.sh`) compiles this same file against loom's,
//! with three threads: the owner ending and reusing, a reader copying, the monitor
//! marking and cancelling.

use super::sync::{AtomicU64, Ordering, fence};

/// Bits of a reconcile id that name its entry's slot in the registry's map (the key);
/// the bits above count the reconciles the entry has held before.
pub(crate) const KEY_BITS: u32 = 42;
pub(crate) const KEY_MASK: u64 = (1 << KEY_BITS) - 1;
/// A reconcile id fits the state word above its three flags.
pub(crate) const LAST_GENERATION: u64 = (1 << (64 - 3 - KEY_BITS)) - 1;

/// A reading of the state word: the id of the entry's latest reconcile and three flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State(u64);

impl State {
    const ACTIVE: u64 = 1;
    /// The monitor reported it hung.
    pub(crate) const HUNG: u64 = 2;
    /// The watchdog asked it to stop.
    pub(crate) const CANCEL: u64 = 4;

    /// Reconcile `id`, running.
    pub(crate) fn active(id: u64) -> Self {
        Self(id << 3 | Self::ACTIVE)
    }

    /// The reconcile's id.
    pub(crate) fn id(self) -> u64 {
        self.0 >> 3
    }

    /// Still running (not ended).
    pub(crate) fn is_active(self) -> bool {
        self.0 & Self::ACTIVE != 0
    }

    /// The monitor reported it hung.
    pub(crate) fn is_hung(self) -> bool {
        self.0 & Self::HUNG != 0
    }

    /// The watchdog asked it to stop.
    pub(crate) fn is_cancelled(self) -> bool {
        self.0 & Self::CANCEL != 0
    }

    /// The same reconcile, ended.
    pub(crate) fn ended(self) -> Self {
        Self(self.id() << 3)
    }

    /// The id of the entry's next reconcile, while the id has room for one.
    pub(crate) fn next_id(self) -> Option<u64> {
        next_id(self.id())
    }
}

/// The registry key of reconcile `id`: its entry's.
pub(crate) fn key_of(id: u64) -> u64 {
    id & KEY_MASK
}

/// The id of the entry's next reconcile after `id`, while the id has room for one.
pub(crate) fn next_id(id: u64) -> Option<u64> {
    (id >> KEY_BITS < LAST_GENERATION).then(|| id + (1 << KEY_BITS))
}

/// The atomic state word of one entry.
pub(crate) struct StateWord(AtomicU64);

impl StateWord {
    /// A word that holds no reconcile yet (id 0, not running).
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Publishes reconcile `id` as running: a registration's last write.
    #[inline]
    pub(crate) fn begin(&self, id: u64) {
        self.0.store(State::active(id).0, Ordering::Release);
    }

    /// Makes the idle entry hold reconcile `id`: `reset` writes its fields for the new
    /// reconcile, then the word publishes it. Only the owner's thread calls it, after
    /// [`end`](Self::end).
    ///
    /// A reader may be copying meanwhile. The fence orders the end's change of the word
    /// before every write of `reset`: a reader that reads any of them and then fences
    /// (see [`read_running`](Self::read_running)) reads the word changed, and drops its
    /// copy. (No instruction on x86.)
    #[inline(always)]
    pub(crate) fn republish(&self, id: u64, reset: impl FnOnce()) {
        fence(Ordering::Release);
        reset();
        self.begin(id);
    }

    /// Ends the running reconcile, and returns its state as it was: whether the monitor
    /// had reported it hung, or the watchdog asked it to stop. A swap, not a store: a
    /// flag may be set up to the last moment, and whichever comes first, the other sees.
    #[inline]
    pub(crate) fn end(&self) -> State {
        let running = State(self.0.load(Ordering::Relaxed));
        State(self.0.swap(running.ended().0, Ordering::AcqRel))
    }

    /// The word now.
    #[inline]
    pub(crate) fn load(&self) -> State {
        State(self.0.load(Ordering::Acquire))
    }

    /// Sets `flag` ([`State::HUNG`], [`State::CANCEL`]) in the state of reconcile `id`,
    /// if it is still running; returns whether it was.
    pub(crate) fn set_flag(&self, id: u64, flag: u64) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let s = State(state);
                (s.is_active() && s.id() == id).then_some(state | flag)
            })
            .is_ok()
    }

    /// A copy of the running reconcile made by `copy` (given its id), or `None` when
    /// the entry is idle, when `copy` gave up, or when the reconcile ended while it was
    /// copied (another may have begun: the copy could mix the two).
    ///
    /// A seqlock's read. The owner changes the word (its end) before it writes any field
    /// of the next reconcile, with a fence between (see [`republish`](Self::republish));
    /// with the fence here, a copy that read any of the next reconcile's fields reads the
    /// word ended or changed. The same reconcile still running after the copy: every
    /// field read was its own.
    #[inline]
    pub(crate) fn read_running<T>(&self, copy: impl FnOnce(u64) -> Option<T>) -> Option<T> {
        let before = self.load();
        if !before.is_active() {
            return None;
        }
        let copied = copy(before.id())?;
        fence(Ordering::Acquire);
        let after = State(self.0.load(Ordering::Relaxed));
        (after.is_active() && after.id() == before.id()).then_some(copied)
    }
}
