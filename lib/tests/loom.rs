//! A loom model of the registry entry's state word: every interleaving of its owner, a reader and the monitor, under the C11 memory model.
//!
//! An entry of the registry holds one reconcile after another. Its owner (the thread that
//! runs its reconciles) ends the current one and, unless the monitor reported it hung,
//! reuses the entry for its next; a reader (a scan, the debug view) copies the running
//! reconcile as a seqlock's reader does; the monitor copies an overdue reconcile, marks
//! it hung, and may ask it to stop. The protocol lives in `lib/src/guard/state.rs`, which
//! this test compiles as it is, against loom's atomics instead of std's (the `sync`
//! module below stands in for the library's). The entry here is cut to what the protocol
//! is about: a field written with relaxed stores (as the start and the poll counters
//! are) and the object behind a read-write lock that readers only try, in the order the
//! library's `Entry::reuse` and `Entry::snapshot_running` use them.
//!
//! What the model asserts, in every interleaving loom explores:
//! - a copy a reader keeps is one reconcile's: its id, object and start all of it;
//! - a hung mark or a cancel request names a reconcile and never lands on the next one;
//! - a reconcile the monitor marked hung has its end queued exactly once, and one it did
//!   not mark has none.
//!
//! `bash tests/loom.sh` runs it, with loom's preemption bound stated there.

#![allow(missing_docs)]

/// The atomics `state.rs` is built on: loom's, in place of the library's std ones.
mod sync {
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
}

#[path = "../src/guard/state.rs"]
#[allow(dead_code, unreachable_pub)]
mod state;

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use loom::sync::{Arc, RwLock};
use state::{State, StateWord};

/// The first reconcile's id (an entry's key in the low bits), and its fields.
const FIRST: u64 = 5;
const FIRST_OBJECT: u64 = 1;
const FIRST_START: u64 = 10;
/// The fields of the entry's next reconcile (its id: `FIRST`'s next).
const NEXT_OBJECT: u64 = 2;
const NEXT_START: u64 = 20;

fn next() -> u64 {
    state::next_id(FIRST).expect("room for a second reconcile")
}

/// One entry of the registry, as the protocol sees it.
struct Entry {
    state: StateWord,
    /// The start: written with a relaxed store at reuse, read with a relaxed load.
    started: AtomicU64,
    object: RwLock<u64>,
    /// Ends queued for the monitor (those of reconciles reported hung).
    queued: AtomicUsize,
}

/// A copy of the running reconcile: id, object, start.
type Copy = (u64, u64, u64);

impl Entry {
    /// The entry with its first reconcile registered and running.
    fn running() -> Self {
        let entry = Self {
            state: StateWord::new(),
            started: AtomicU64::new(FIRST_START),
            object: RwLock::new(FIRST_OBJECT),
            queued: AtomicUsize::new(0),
        };
        entry.state.begin(FIRST);
        entry
    }

    /// The owner ends its reconcile as the guard's drop does: the end of one reported
    /// hung is queued and the entry is not reused; any other's entry takes the next
    /// reconcile (as `Entry::reuse` does). Returns the state the end found.
    fn end_and_reuse(&self) -> State {
        let ended = self.state.end();
        if ended.is_hung() {
            self.queued.fetch_add(1, Relaxed);
        } else {
            let next = ended.next_id().expect("room");
            self.state.republish(next, || {
                *self.object.write().expect("no poison") = NEXT_OBJECT;
                self.started.store(NEXT_START, Relaxed);
            });
        }
        ended
    }

    /// A reader's copy of the running reconcile, as `Entry::snapshot_running` takes it:
    /// the object (tried, never waited for), then the fields, checked by the state word.
    fn copy(&self) -> Option<Copy> {
        self.state.read_running(|id| {
            let object = *self.object.try_read().ok()?;
            Some((id, object, self.started.load(Relaxed)))
        })
    }

    /// The monitor's scan of reconcile `overdue`, as `Registry::scan_into` does it once
    /// it read the state word and found that reconcile past its deadline: copy, keep
    /// the copy only if it is of that reconcile, then mark it; the copy is reported
    /// only when the mark landed.
    fn scan(&self, overdue: u64) -> Option<Copy> {
        let copy = self.copy().filter(|copy| copy.0 == overdue)?;
        self.state.set_flag(copy.0, State::HUNG).then_some(copy)
    }
}

/// Whether `copy` is wholly one reconcile's.
fn assert_one_reconciles(copy: Copy) {
    assert!(
        copy == (FIRST, FIRST_OBJECT, FIRST_START) || copy == (next(), NEXT_OBJECT, NEXT_START),
        "a copy mixes two reconciles: {copy:?}"
    );
}

fn model(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    // Bugs of this kind show within two or three preemptions; tests/loom.sh may raise
    // it with LOOM_MAX_PREEMPTIONS.
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(test);
}

/// A reader copying while the owner ends the reconcile and reuses the entry keeps only
/// copies that are one reconcile's.
#[test]
fn a_copy_kept_is_one_reconciles() {
    model(|| {
        let entry = Arc::new(Entry::running());
        let reader = {
            let entry = Arc::clone(&entry);
            loom::thread::spawn(move || entry.copy())
        };
        entry.end_and_reuse();
        if let Some(copy) = reader.join().expect("no panic") {
            assert_one_reconciles(copy);
        }
        // After the reuse, a copy is the next reconcile's.
        assert_eq!(entry.copy(), Some((next(), NEXT_OBJECT, NEXT_START)));
    });
}

/// The monitor marking and cancelling the first reconcile while the owner ends it and
/// reuses the entry: neither lands on the next reconcile, and the end is queued exactly
/// when the mark landed.
#[test]
fn marks_and_cancels_land_on_their_reconcile_and_a_hung_end_is_queued_once() {
    model(|| {
        let entry = Arc::new(Entry::running());
        let monitor = {
            let entry = Arc::clone(&entry);
            loom::thread::spawn(move || {
                let marked = entry.state.set_flag(FIRST, State::HUNG);
                let cancelled = entry.state.set_flag(FIRST, State::CANCEL);
                (marked, cancelled)
            })
        };
        let ended = entry.end_and_reuse();
        let (marked, cancelled) = monitor.join().expect("no panic");
        assert_eq!(
            ended.is_hung(),
            marked,
            "the end saw the mark exactly when it landed"
        );
        assert_eq!(ended.is_cancelled(), cancelled);
        assert_eq!(entry.queued.load(Relaxed), usize::from(marked));
        let now = entry.state.load();
        if marked {
            // Not reused: it leaves the map with its end.
            assert!(!now.is_active() && now.id() == FIRST);
        } else {
            assert!(now.is_active() && now.id() == next());
            assert!(
                !now.is_hung() && !now.is_cancelled(),
                "a flag on the next reconcile"
            );
        }
    });
}

/// All three at once: the owner ends and reuses, a reader copies, the monitor scans
/// (copy, then mark) and asks the first reconcile to stop. Every copy kept is one
/// reconcile's; what the monitor reports is the first reconcile as it was; a reported
/// reconcile's end is queued once and its entry not reused.
#[test]
fn owner_reader_and_monitor_together() {
    model(|| {
        let entry = Arc::new(Entry::running());
        let reader = {
            let entry = Arc::clone(&entry);
            loom::thread::spawn(move || entry.copy())
        };
        let monitor = {
            let entry = Arc::clone(&entry);
            loom::thread::spawn(move || {
                let reported = entry.scan(FIRST);
                let cancelled = entry.state.set_flag(FIRST, State::CANCEL);
                (reported, cancelled)
            })
        };
        let ended = entry.end_and_reuse();
        if let Some(copy) = reader.join().expect("no panic") {
            assert_one_reconciles(copy);
        }
        let (reported, cancelled) = monitor.join().expect("no panic");
        if let Some(copy) = reported {
            // The report is of the reconcile judged overdue, as it was.
            assert_eq!(copy, (FIRST, FIRST_OBJECT, FIRST_START));
        }
        assert_eq!(ended.is_hung(), reported.is_some());
        assert_eq!(entry.queued.load(Relaxed), usize::from(reported.is_some()));
        assert_eq!(ended.is_cancelled(), cancelled);
        let now = entry.state.load();
        if now.is_active() {
            assert_eq!(now.id(), next());
            assert!(
                !now.is_hung() && !now.is_cancelled(),
                "a flag on the next reconcile"
            );
        }
    });
}
