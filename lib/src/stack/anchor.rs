//! Where the guard's poll frame is on each thread, so that a capture can tell whether its
//! walk went through it.
//!
//! The guard stores a stack address of its poll frame at each poll's entry (one store in
//! a cell the thread owns) and puts the outer poll's back at the exit; a capture reads
//! the cell of the thread it unwinds and checks that the frame its walk found at that
//! address is the guard's poll (see `capture_impl`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The anchor cells of the live threads that have one, by kernel tid.
static ANCHORS: Mutex<Vec<(u32, Arc<AtomicUsize>)>> = Mutex::new(Vec::new());

/// A thread's anchor cell, held by the thread for its life (dropping it withdraws it).
#[derive(Debug)]
pub(crate) struct Anchor {
    tid: Option<u32>,
    cell: Arc<AtomicUsize>,
}

impl Anchor {
    /// The calling thread's cell, registered under its kernel `tid` when known.
    pub(crate) fn register(tid: Option<u32>) -> Self {
        let cell = Arc::new(AtomicUsize::new(0));
        if let Some(tid) = tid {
            ANCHORS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((tid, Arc::clone(&cell)));
        }
        Self { tid, cell }
    }

    /// Records `at`, a stack address in the poll frame just entered, and returns the
    /// outer poll's (0: none), for [`Self::restore`] at the exit.
    #[inline]
    pub(crate) fn enter(&self, at: usize) -> usize {
        let outer = self.cell.load(Ordering::Relaxed);
        self.cell.store(at, Ordering::Relaxed);
        outer
    }

    /// Puts back the outer poll's address at a poll's exit.
    #[inline]
    pub(crate) fn restore(&self, outer: usize) {
        self.cell.store(outer, Ordering::Relaxed);
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        if let Some(tid) = self.tid {
            let mut anchors = ANCHORS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = anchors
                .iter()
                .position(|(t, cell)| *t == tid && Arc::ptr_eq(cell, &self.cell))
            {
                anchors.swap_remove(at);
            }
        }
    }
}

/// The stack address of the guard's poll that thread `tid` is in, if it is in one.
#[cfg_attr(
    not(all(feature = "stack-capture", target_os = "linux")),
    allow(dead_code)
)]
pub(crate) fn of(tid: u32) -> Option<usize> {
    let anchors = ANCHORS.lock().unwrap_or_else(|p| p.into_inner());
    let (_, cell) = anchors.iter().find(|(t, _)| *t == tid)?;
    Some(cell.load(Ordering::Relaxed)).filter(|&at| at != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_inside_a_poll_gives_the_outer_one_back() {
        let anchor = Anchor::register(Some(u32::MAX - 1));
        assert_eq!(of(u32::MAX - 1), None, "in no poll");
        let outer = anchor.enter(0x7000);
        let inner = anchor.enter(0x6000);
        assert_eq!(of(u32::MAX - 1), Some(0x6000));
        anchor.restore(inner);
        assert_eq!(of(u32::MAX - 1), Some(0x7000));
        anchor.restore(outer);
        assert_eq!(of(u32::MAX - 1), None);
        drop(anchor);
        assert_eq!(of(u32::MAX - 1), None);
        assert!(
            !ANCHORS
                .lock()
                .unwrap()
                .iter()
                .any(|(t, _)| *t == u32::MAX - 1),
            "withdrawn"
        );
    }
}
