//! The reconcile being polled on this thread, which its guard publishes while request
//! attribution is on, for the kube client layer to attribute the requests it sends.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use super::entry::Entry;

thread_local! {
    /// The reconcile being polled on this thread, published by its guard while request
    /// attribution is on, for the client layer to find: a reference the `Guarded` holds
    /// for this and lends for the poll.
    ///
    /// `ManuallyDrop`: a thread-local with drop glue is set up lazily, and each access
    /// then checks whether it was (8 instructions a poll, callgrind). Nothing is left
    /// here to drop: each poll's exit takes its reference back, unwinding included
    /// (the guard catches the reconcile's panic).
    static CURRENT: ManuallyDrop<Cell<Option<Arc<Entry>>>> =
        const { ManuallyDrop::new(Cell::new(None)) };
}

/// Set once a client layer that attributes requests exists: from then on, guards
/// publish their reconcile to the thread while they poll it.
static ATTRIBUTING: AtomicBool = AtomicBool::new(false);

/// Turns request attribution on for the guards made from now on.
#[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
pub(crate) fn attribute_requests() {
    ATTRIBUTING.store(true, Ordering::Relaxed);
}

/// Whether guards publish their reconcile to the thread while they poll it.
#[inline]
pub(crate) fn attributing() -> bool {
    ATTRIBUTING.load(Ordering::Relaxed)
}

/// Swaps `current` with the thread's current reconcile: called with the reference a
/// `Guarded` lends on a poll's entry, and again on its exit, which takes it back and
/// puts back what was there (an outer guard's, or none). Two moves of a pointer: no
/// reference count changes.
#[inline]
pub(crate) fn swap_current(current: &mut Option<Arc<Entry>>) {
    CURRENT.with(|c| *current = c.replace(current.take()));
}

/// The reconcile being polled on this thread, if its guard published it; unowned, so
/// that it does not count as a waker.
#[cfg_attr(not(feature = "_kube"), allow(dead_code))] // the request layer's
pub(crate) fn current_entry() -> Option<Weak<Entry>> {
    CURRENT.with(|c| {
        let current = c.take();
        let copy = current.as_ref().map(Arc::downgrade);
        c.set(current);
        copy
    })
}
