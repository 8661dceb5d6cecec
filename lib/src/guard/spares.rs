//! The entries a thread keeps idle in the map for its next reconciles: no allocation,
//! no map insertion and no removal for a reconcile that reuses one.

use std::cell::Cell;
use std::sync::Arc;

use super::controller::Controller;
use super::entry::Entry;

/// Spare entries a thread keeps: enough for the controllers whose reconciles its
/// runtime's tasks interleave, few enough that the map holds few idle entries.
pub(super) const SPARES_PER_THREAD: usize = 4;

thread_local! {
    /// Entries whose reconciles ended on this thread with nothing else holding them,
    /// left idle in the map for the thread's next reconciles of their controllers
    /// (at most one per controller, mostly): an allocation, a free, a map insertion
    /// and a removal saved per reconcile (the insertion and the removal alone were
    /// about 210 of the guard's 916 instructions, callgrind). At most
    /// [`SPARES_PER_THREAD`] entries' memory (and their controllers') per thread.
    pub(super) static SPARES: Spares = const { Spares([const { Cell::new(None) }; SPARES_PER_THREAD]) };
}

/// The thread's spare entries; they leave the map with the thread.
pub(super) struct Spares([Cell<Option<Arc<Entry>>>; SPARES_PER_THREAD]);

impl Spares {
    /// Takes a spare of `controller`.
    #[inline]
    pub(super) fn take(&self, controller: &Arc<Controller>) -> Option<Arc<Entry>> {
        for cell in &self.0 {
            match cell.take() {
                Some(spare) if Arc::ptr_eq(&spare.controller, controller) => return Some(spare),
                other => cell.set(other),
            }
        }
        None
    }

    /// Keeps `entry` in the first free place, unless a spare of its controller comes
    /// first (then it gives `entry` back); when every place holds another controller's
    /// spare, the first is given back, the others move up and `entry` takes the last
    /// place, so that the controllers (and registries) a thread no longer runs do not
    /// keep theirs.
    #[inline]
    fn keep(&self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        for cell in &self.0 {
            match cell.take() {
                None => {
                    cell.set(Some(entry));
                    return None;
                }
                Some(kept) => {
                    let same = Arc::ptr_eq(&kept.controller, &entry.controller);
                    cell.set(Some(kept));
                    if same {
                        return Some(entry);
                    }
                }
            }
        }
        let oldest = self.0[0].take();
        for i in 1..SPARES_PER_THREAD {
            self.0[i - 1].set(self.0[i].take());
        }
        self.0[SPARES_PER_THREAD - 1].set(Some(entry));
        oldest
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        for cell in &self.0 {
            if let Some(entry) = cell.take() {
                leave_map(&entry);
            }
        }
    }
}

/// Takes an idle entry out of its registry's map: off the common path, where an entry
/// stays as a spare.
#[cold]
#[inline(never)]
pub(super) fn leave_map(entry: &Entry) {
    entry.controller.map.in_flight.remove(&entry.key());
}

/// Keeps an idle entry as one of the thread's spares; what is not kept (it, or the
/// spare it displaces) leaves the map. (During the thread's exit, when its thread-locals
/// are gone, it leaves the map too.) Inlined into the guard's drop: as a call it cost
/// about 10 instructions a reconcile.
#[inline(always)]
pub(super) fn keep_as_spare(entry: Arc<Entry>) {
    let mut unused = Some(entry);
    let _ = SPARES.try_with(|spares| unused = unused.take().and_then(|e| spares.keep(e)));
    if let Some(entry) = unused {
        leave_map(&entry);
    }
}

/// Puts back an idle entry this thread's registration could not use: it stays a spare
/// while it has ids left, and leaves the map otherwise.
#[cold]
pub(super) fn release(spare: Arc<Entry>) {
    if spare.next_reconcile().is_some() {
        keep_as_spare(spare);
    } else {
        leave_map(&spare);
    }
}
