//! Which OS thread and tokio task a poll ran on, recorded without allocating per poll.
//!
//! Each thread gets a small number (its slot) the first time it polls a guarded
//! reconcile; its name and kernel thread id are stored once in a process-wide table so
//! that the per-poll cost is one thread-local read.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use dashmap::DashMap;

/// The OS thread a reconcile was last polled on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// The thread's name, or `unnamed`.
    pub name: Arc<str>,
    /// The kernel's thread id (Linux), for `/proc/self/task/<tid>` and signals.
    pub tid: Option<u32>,
    /// The standard library's id of the thread, as tokio names a worker's thread.
    pub id: std::thread::ThreadId,
    /// The tokio runtime the thread was in at its first guarded poll. A runtime's worker
    /// and blocking threads belong to it for their whole life; another thread may enter
    /// several runtimes, and only the first is kept.
    pub runtime: Option<tokio::runtime::Id>,
}

static NEXT_SLOT: AtomicU64 = AtomicU64::new(1);
static THREADS: LazyLock<DashMap<u64, ThreadInfo>> = LazyLock::new(DashMap::new);

struct Slot {
    id: u64,
    /// The thread's alternate signal stack, so that a capture may signal it while it
    /// runs; released when the thread ends.
    _alt_stack: crate::stack::AltStack,
    /// Where the guard's poll frame is while the thread is in one, for captures.
    _anchor: crate::stack::anchor::Anchor,
}

impl Drop for Slot {
    fn drop(&mut self) {
        THREADS.remove(&self.id);
    }
}

thread_local! {
    static SLOT: Slot = {
        let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
        let current = std::thread::current();
        let name = current.name().unwrap_or("unnamed").into();
        // Once per thread, never per poll: which runtime's threads the watchdog's rescue
        // may name.
        let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
        let tid = kernel_tid();
        let id = current.id();
        THREADS.insert(
            slot,
            ThreadInfo {
                name,
                tid,
                id,
                runtime,
            },
        );
        Slot {
            id: slot,
            _alt_stack: crate::stack::prepare_thread(),
            _anchor: crate::stack::anchor::Anchor::register(tid),
        }
    };
}

thread_local! {
    /// The innermost label pending in the poll under way (see `crate::label`).
    static LABEL: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Replaces the thread's pending label, returning the one it held.
#[inline]
pub(crate) fn swap_label(label: Option<&'static str>) -> Option<&'static str> {
    LABEL.with(|l| l.replace(label))
}

/// Names the await under way unless an await inside it already did: called by a
/// labelled future after its inner future returned pending.
#[inline]
pub(crate) fn offer_label(label: &'static str) {
    LABEL.with(|l| {
        if l.get().is_none() {
            l.set(Some(label));
        }
    });
}

/// The calling thread's slot (never 0).
#[inline]
pub(crate) fn current_slot() -> u64 {
    SLOT.with(|s| s.id)
}

/// Records `at`, a stack address in the frame of the guard's poll the thread enters, for
/// a capture of the thread to check its walk against; returns the outer poll's, which
/// [`leave_poll_frame`] puts back.
#[inline]
pub(crate) fn enter_poll_frame(at: usize) -> usize {
    crate::stack::anchor::enter(at)
}

/// Puts back the outer poll's frame address (see [`enter_poll_frame`]).
#[inline]
pub(crate) fn leave_poll_frame(outer: usize) {
    crate::stack::anchor::leave(outer);
}

/// What is known of the thread in `slot`, while it lives.
pub(crate) fn info(slot: u64) -> Option<ThreadInfo> {
    if slot == 0 {
        return None;
    }
    THREADS.get(&slot).map(|t| t.value().clone())
}

/// The kernel ids of the live threads that have polled a guarded reconcile inside the
/// runtime `runtime`, into `out`. Takes each shard's read lock of the thread table in
/// turn, which a thread's first guarded poll and its exit hold for one insertion or
/// removal.
pub(crate) fn tids_of_runtime(runtime: tokio::runtime::Id, out: &mut Vec<u32>) {
    out.clear();
    out.extend(
        THREADS
            .iter()
            .filter(|t| t.runtime == Some(runtime))
            .filter_map(|t| t.tid),
    );
}

/// Looks threads up for a whole scan: a scan meets the same few threads again and
/// again, so each is looked up in the process-wide table once.
#[derive(Default)]
pub(crate) struct InfoCache {
    seen: Vec<(u64, Option<ThreadInfo>)>,
}

impl InfoCache {
    /// Like [`info`], remembered.
    pub(crate) fn info(&mut self, slot: u64) -> Option<ThreadInfo> {
        if slot == 0 {
            return None;
        }
        if let Some((_, known)) = self.seen.iter().find(|(s, _)| *s == slot) {
            return known.clone();
        }
        let found = info(slot);
        self.seen.push((slot, found.clone()));
        found
    }
}

/// The current tokio task's id as a number, or 0 outside a task.
#[inline]
pub(crate) fn current_task_id() -> u64 {
    tokio::task::try_id().map_or(0, task_id_number)
}

/// A tokio task id as the number it prints as.
pub(crate) fn task_id_number(id: tokio::task::Id) -> u64 {
    // tokio::task::Id has no public integer accessor, but it hashes as its u64.
    struct Capture(u64);
    impl Hasher for Capture {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(*b);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }
    let mut h = Capture(0);
    id.hash(&mut h);
    h.finish()
}

#[cfg(target_os = "linux")]
pub(crate) fn kernel_tid() -> Option<u32> {
    // "/proc/thread-self" links to "<pid>/task/<tid>": read once per thread, no unsafe.
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn kernel_tid() -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_name_their_threads() {
        let handle = std::thread::Builder::new()
            .name("slot-test".into())
            .spawn(|| {
                let slot = current_slot();
                (slot, info(slot))
            })
            .unwrap();
        let (slot, seen) = handle.join().unwrap();
        let seen = seen.expect("info while the thread lives");
        assert_eq!(&*seen.name, "slot-test");
        if cfg!(target_os = "linux") {
            assert!(seen.tid.is_some());
        }
        assert_eq!(seen.runtime, None, "outside any runtime");
        // The thread has exited: its slot is gone.
        assert!(info(slot).is_none());
    }

    #[test]
    fn a_runtime_thread_is_known_by_its_runtime() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let seen = runtime
            .block_on(runtime.spawn(async { info(current_slot()) }))
            .unwrap()
            .expect("info while the thread lives");
        assert_eq!(seen.runtime, Some(runtime.handle().id()));
    }

    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    #[test]
    fn a_thread_the_guard_sees_gets_an_alternate_signal_stack() {
        use crate::stack::alt_stack::tests::{drop_alternate_stack, has_alternate_stack};
        std::thread::spawn(|| {
            drop_alternate_stack();
            assert!(!has_alternate_stack());
            current_slot();
            assert!(
                has_alternate_stack(),
                "installed at the thread's first slot"
            );
        })
        .join()
        .unwrap();
    }

    #[tokio::test]
    async fn task_ids_match_tokio() {
        let handle = tokio::spawn(async { (current_task_id(), tokio::task::id().to_string()) });
        let (ours, theirs) = handle.await.unwrap();
        assert_eq!(ours.to_string(), theirs);
        assert_eq!(current_task_id(), 0, "outside a task");
    }
}
