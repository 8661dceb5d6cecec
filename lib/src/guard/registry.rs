//! The registry of in-flight reconciles: the handles it makes, what it tells of them,
//! and the monitor's calls (the scan, the rescue's look-up, the ends of hung reconciles,
//! cancel requests).

use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::{Duration, Instant};

use super::deadlines::Deadlines;
use super::entry::{Clocks, key_of};
use super::fanout::Fanout;
use super::handle::ControllerHandle;
use super::map::Shared;
use super::observer::{Ended, Observer};
use super::reconcile::{InFlight, PollState};
use super::thread::InfoCache;

/// The in-flight reconciles of a process. Cheap to clone: clones share one map.
#[derive(Clone)]
pub struct Registry {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("in_flight", &self.len())
            .finish()
    }
}

impl Registry {
    /// An empty registry whose controllers get these deadlines.
    #[must_use]
    pub fn new(deadlines: impl Into<Deadlines>) -> Self {
        Self::build(deadlines.into(), Vec::new())
    }

    /// Like [`new`](Self::new), telling `observer` of every reconcile that ends.
    #[must_use]
    pub fn with_observer(deadlines: impl Into<Deadlines>, observer: Arc<dyn Observer>) -> Self {
        Self::build(deadlines.into(), vec![observer])
    }

    /// Like [`new`](Self::new), telling each of `observers`, in order, of every
    /// reconcile that ends. Cheaper per reconcile than the same [`Fanout`] given to
    /// [`with_observer`](Self::with_observer), which tells them through one more call.
    #[must_use]
    pub fn with_observers(deadlines: impl Into<Deadlines>, observers: Fanout) -> Self {
        Self::build(deadlines.into(), observers.into_observers())
    }

    fn build(deadlines: Deadlines, observers: Vec<Arc<dyn Observer>>) -> Self {
        Self {
            shared: Arc::new(Shared::new(deadlines, observers)),
        }
    }

    /// The deadlines this registry hands out.
    #[must_use]
    pub fn deadlines(&self) -> &Deadlines {
        &self.shared.deadlines
    }

    /// A handle that registers reconciles of one controller, with that controller's
    /// deadline resolved once here rather than on every reconcile.
    #[must_use]
    pub fn controller(&self, name: &str, kind: &str) -> ControllerHandle {
        let deadline = self.shared.deadlines.for_controller(name);
        ControllerHandle::new(&self.shared, name.into(), kind.into(), deadline)
    }

    /// How many reconciles are in flight (a pass over the map).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared
            .in_flight
            .iter()
            .filter(|slot| slot.entry.state().is_active())
            .count()
    }

    /// Whether no reconcile is in flight.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        !self
            .shared
            .in_flight
            .iter()
            .any(|slot| slot.entry.state().is_active())
    }

    /// A copy of every in-flight reconcile. Holds each shard's read lock only while
    /// copying it: reconciles that start or end on a spare entry do not wait for it, and
    /// those that insert or remove an entry take another shard or wait for at most one
    /// shard's copy.
    #[must_use]
    pub fn snapshot(&self) -> Vec<InFlight> {
        let clocks = Clocks::now();
        let mut threads = InfoCache::default();
        self.shared
            .in_flight
            .iter()
            .filter_map(|slot| slot.entry.snapshot_running(&clocks, &mut threads))
            .collect()
    }

    /// What the monitor needs of one scan, cheaply: copies into `out` only the
    /// reconciles past their deadline at `now` (and, with `in_poll`, those inside a poll),
    /// and counts every reconcile per controller into `counts` (each controller's
    /// in-flight counter). On-time reconciles are passed over from the map alone,
    /// without touching their entries (see `Slot::started`). Each overdue
    /// reconcile is marked as reported hung, as the verdict reports every one it is given, so
    /// that its end is queued for [`take_ended`](Self::take_ended).
    pub(crate) fn scan_into(
        &self,
        now: Instant,
        in_poll: bool,
        out: &mut Vec<InFlight>,
        counts: &mut ControllerCounts,
    ) {
        out.clear();
        counts.clear();
        let clocks = Clocks::at(now);
        let mut threads = InfoCache::default();
        // Controllers are few: tell them apart by the address in the slot, and read a
        // controller's name and deadline from its first entry only. Per controller, the
        // reconciles that started before `overdue_before` are overdue (none when the
        // deadline reaches back past the clock's origin).
        let epoch = self.shared.epoch;
        let mut seen: Vec<(usize, Option<u64>)> = Vec::new();
        for slot in self.shared.in_flight.iter() {
            let overdue_before = match seen.iter().position(|&(c, _)| c == slot.controller) {
                Some(i) => seen[i].1,
                None => {
                    let controller = &slot.entry.controller;
                    let overdue_before = now
                        .checked_sub(controller.deadline)
                        .map(|before| epoch.nanos(before));
                    seen.push((slot.controller, overdue_before));
                    let in_flight = controller.in_flight.load(Ordering::Relaxed);
                    if in_flight > 0 {
                        counts.push((Arc::clone(&controller.name), in_flight));
                    }
                    overdue_before
                }
            };
            // Past it by the slot's start (a lower bound): maybe overdue.
            let past =
                overdue_before.filter(|&before| slot.started.load(Ordering::Relaxed) < before);
            if past.is_none() && !in_poll {
                continue;
            }
            let entry = &slot.entry;
            let state = entry.state();
            if !state.is_active() {
                continue;
            }
            if let Some(before) = past {
                // Read after the state: a reconcile's start is written before the state
                // word publishes it.
                let started = entry.started();
                if started < before {
                    // The verdict reports every reconcile this scan finds overdue as
                    // hung. Copy it, then mark it, before the verdict looks. The copy is
                    // checked as a seqlock's read (and dropped, to be taken at the next
                    // scan, when the reconcile ends meanwhile or its thread holds the
                    // object): it never waits for the reconcile's thread. The mark and
                    // the reconcile's end are each one step on its state word, so one
                    // that ends from here on, however soon, queues its end; one that
                    // ended first is not marked, and not reported.
                    if let Some(copy) = entry.snapshot_running(&clocks, &mut threads)
                        && copy.id == state.id()
                        && entry.mark_reported_hung(copy.id)
                    {
                        out.push(copy);
                    }
                    continue;
                }
                // On time: the slot takes its start, so that the next scans pass over
                // it without looking at the entry until this reconcile nears its own
                // deadline.
                slot.started.store(started, Ordering::Relaxed);
            }
            if in_poll
                && entry.in_poll()
                && let Some(copy) = entry.snapshot_running(&clocks, &mut threads)
            {
                out.push(copy);
            }
        }
    }

    /// Copies into `out` only the reconciles inside a poll that began at least `for_at_least`
    /// before `now`: a rescue's culprits. Like [`scan_into`](Self::scan_into) with
    /// `in_poll`, it reads one word of each entry and copies none but those; it marks
    /// nothing. Returns how many entries it read, the measure of its cost.
    pub(crate) fn in_poll_into(
        &self,
        now: Instant,
        for_at_least: Duration,
        out: &mut Vec<InFlight>,
    ) -> u64 {
        out.clear();
        let clocks = Clocks::at(now);
        let mut threads = InfoCache::default();
        let mut read = 0;
        for slot in self.shared.in_flight.iter() {
            read += 1;
            if !slot.entry.in_poll() {
                continue;
            }
            if let Some(copy) = slot.entry.snapshot_running(&clocks, &mut threads)
                && matches!(copy.poll, PollState::InPoll { since }
                    if now.saturating_duration_since(since) >= for_at_least)
            {
                out.push(copy);
            }
        }
        read
    }

    /// A copy of reconcile `id`, while it is in flight.
    pub(crate) fn get(&self, id: u64) -> Option<InFlight> {
        let entry = Arc::clone(&self.shared.in_flight.get(&key_of(id))?.entry);
        entry.snapshot_of(id)
    }

    /// Takes the reconciles that ended after being reported hung. Never waits: each end
    /// is taken once, and an end queued meanwhile, or while another caller takes, is
    /// taken at the next call.
    #[must_use]
    pub(crate) fn take_ended(&self) -> Vec<Ended> {
        let taken = match self.shared.ended_taken.try_lock() {
            Ok(taken) => taken,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // The monitor is the only caller but for tests: what the other takes is theirs.
            Err(TryLockError::WouldBlock) => return Vec::new(),
        };
        taken.try_iter().collect()
    }

    /// Asks reconcile `id` to stop at its next poll and wakes it. Returns false when it
    /// has already ended.
    pub(crate) fn request_cancel(&self, id: u64) -> bool {
        // Clone the Arc out so no shard lock is held while waking: the waker may run
        // arbitrary code.
        let entry = self
            .shared
            .in_flight
            .get(&key_of(id))
            .map(|e| Arc::clone(&e.value().entry));
        entry.is_some_and(|entry| entry.request_cancel(id))
    }
}

impl ControllerHandle {
    /// The registry it registers in.
    #[must_use]
    pub fn registry(&self) -> Registry {
        Registry {
            shared: Arc::clone(&self.controller.map),
        }
    }
}

/// In-flight reconciles per controller, as a scan counted them.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub type ControllerCounts = Vec<(Arc<str>, usize)>;
