//! Where the guard's poll frame is on each thread, so that a capture can tell whether its
//! walk went through it.
//!
//! The guard stores a stack address of its poll frame in a thread-local at each poll's
//! entry, and puts the outer poll's back at the exit: a plain store to a thread-local
//! without lazy initialisation, a few instructions. A thread registers the address of
//! its cell once (at its first guarded poll), and a capture reads the cell of the thread
//! it unwinds, to check that the frame its walk found at that address is the guard's
//! poll (see `check_against_the_poll_frame`).
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// A stack address in the frame of the guard's poll the thread is in (0: none).
    static POLL_FRAME: AtomicUsize = const { AtomicUsize::new(0) };
}

/// The live threads that registered their cell: kernel tid and the cell's address.
static REGISTERED: Mutex<Vec<(u32, usize)>> = Mutex::new(Vec::new());

/// Records `at`, a stack address in the frame of the guard's poll the calling thread
/// enters, and returns the outer poll's (0: none), which [`leave`] puts back.
#[inline]
pub(crate) fn enter(at: usize) -> usize {
    POLL_FRAME.with(|frame| {
        let outer = frame.load(Ordering::Relaxed);
        frame.store(at, Ordering::Relaxed);
        outer
    })
}

/// Puts back the outer poll's frame address at a poll's exit (see [`enter`]).
#[inline]
pub(crate) fn leave(outer: usize) {
    POLL_FRAME.with(|frame| frame.store(outer, Ordering::Relaxed));
}

/// The calling thread's registration, held by the thread until it ends; its drop
/// withdraws it. It cannot leave the thread (its cell is the thread's).
#[derive(Debug)]
pub(crate) struct Anchor {
    tid: Option<u32>,
    _on_this_thread: PhantomData<*const ()>,
}

impl Anchor {
    /// Registers the calling thread's cell under its kernel `tid`, when known.
    pub(crate) fn register(tid: Option<u32>) -> Self {
        if let Some(tid) = tid {
            let cell = POLL_FRAME.with(|frame| std::ptr::from_ref(frame).expose_provenance());
            REGISTERED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((tid, cell));
        }
        Self {
            tid,
            _on_this_thread: PhantomData,
        }
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        let Some(tid) = self.tid else {
            return;
        };
        let cell = POLL_FRAME.with(|frame| std::ptr::from_ref(frame).expose_provenance());
        let mut registered = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = registered.iter().position(|r| *r == (tid, cell)) {
            registered.swap_remove(at);
        }
    }
}

/// The stack address of the guard's poll that thread `tid` is in, if it is in one and
/// the list could be read (see [`super::lock_briefly`]: the monitor calls this).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(crate) fn of(tid: u32) -> Option<usize> {
    let registered = super::lock_briefly(&REGISTERED)?;
    let &(_, cell) = registered.iter().find(|(t, _)| *t == tid)?;
    // SAFETY: `cell` is the address of thread `tid`'s `POLL_FRAME`, registered by that
    // thread and withdrawn by it (under this lock) before it ends, while its thread-locals
    // are still in place: while the lock is held and the entry is here, the cell is
    // alive. It is an atomic, so reading it beside its thread's stores is no data race.
    let frame = unsafe { &*std::ptr::with_exposed_provenance::<AtomicUsize>(cell) };
    Some(frame.load(Ordering::Relaxed)).filter(|&at| at != 0)
}

#[cfg(all(test, feature = "stack-capture", target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_poll_inside_a_poll_gives_the_outer_one_back() {
        std::thread::spawn(|| {
            let tid = crate::guard::kernel_tid();
            let anchor = Anchor::register(tid);
            let tid = tid.unwrap();
            assert_eq!(of(tid), None, "in no poll");
            let outer = enter(0x7000);
            let inner = enter(0x6000);
            assert_eq!(of(tid), Some(0x6000));
            leave(inner);
            assert_eq!(of(tid), Some(0x7000));
            leave(outer);
            assert_eq!(of(tid), None);
            enter(0x7000);
            drop(anchor);
            assert_eq!(of(tid), None, "withdrawn");
        })
        .join()
        .unwrap();
    }
}
