//! The alternate signal stack a thread must have before the capture signal is sent to it.
//!
//! The capture's handler runs with `SA_ONSTACK`: on the thread's alternate signal stack,
//! so that a thread interrupted near the end of its own stack is not pushed over it. Only
//! some threads have one (the standard library installs one on the threads it starts,
//! and on the main thread, when the program's `main` is Rust's), and a thread's can only
//! be queried by the thread itself. So each thread the guard polls on calls [`prepare`]
//! once: it installs a stack where the thread has none, or has one too small for the
//! handler on this CPU (whose signal frame grows with its vector registers), and records
//! the thread as ready; a capture signals only threads recorded here. The stack is
//! released, the embedder's put back, and the record dropped, when the thread ends.
#![allow(unsafe_code)]

use std::sync::Mutex;

/// The kernel tids of the live threads known to have an alternate signal stack.
static READY: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// `AT_MINSIGSTKSZ` (the kernel's minimum for a signal frame on this CPU, larger than
/// `MINSIGSTKSZ` with wide vector registers); not in every `libc` crate's constants.
const AT_MINSIGSTKSZ: libc::c_ulong = 51;

/// Room for the handler's own frames above the kernel's signal frame (it calls only
/// `gettid`, `clock_gettime` and `futex`).
const HANDLER_ROOM: usize = 8 * 1024;

/// A thread's readiness for the capture signal, held by the thread for its life: its
/// drop, at the thread's end, withdraws the record and releases a stack installed here.
#[derive(Debug)]
pub(crate) struct AltStack {
    /// The thread's kernel tid, when it was recorded as ready.
    tid: Option<u32>,
    /// The mapping installed here (its start, with the guard page, and its length).
    ours: Option<(usize, usize)>,
    /// The thread's own alternate stack that ours replaced (too small), put back when
    /// ours is released.
    theirs: Option<libc::stack_t>,
}

/// How large an alternate stack the capture's handler needs on this CPU: the kernel's
/// signal frame (`AT_MINSIGSTKSZ`, at least `MINSIGSTKSZ`) and the handler's own room.
fn needed() -> usize {
    // SAFETY: `getauxval` reads the process's auxiliary vector; 0 when the entry is
    // missing (kernels before 5.14).
    let minimum = unsafe { libc::getauxval(AT_MINSIGSTKSZ) } as usize;
    minimum.max(libc::MINSIGSTKSZ) + HANDLER_ROOM
}

/// Makes the calling thread ready for the capture signal: records it when it has an
/// alternate signal stack large enough for the handler, installing one first when it has
/// none or a smaller one (which is kept, to be put back). A thread where that fails is
/// not recorded (captures of it while it runs are refused, and say why).
pub(crate) fn prepare() -> AltStack {
    let mut prepared = AltStack {
        tid: None,
        ours: None,
        theirs: None,
    };
    let Some(tid) = gettid() else {
        return prepared;
    };
    let Some(stack) = current() else {
        return prepared;
    };
    let enabled = stack.ss_flags & libc::SS_DISABLE == 0;
    if !enabled || stack.ss_size < needed() {
        // A stack in use (a handler of the thread's own is running on it) is not
        // replaced under it.
        if stack.ss_flags & libc::SS_ONSTACK != 0 {
            return prepared;
        }
        let Some(ours) = install() else {
            tracing::info!(
                target: "reconcile_watchdog::stack",
                tid,
                "no alternate signal stack could be installed for the capture's handler: \
                 captures of this thread while it runs will not signal it"
            );
            return prepared;
        };
        prepared.ours = Some(ours);
        prepared.theirs = enabled.then_some(stack);
        if enabled {
            // Said once per thread: the embedder's stack is not what its handlers run on
            // while the guard holds the thread.
            tracing::info!(
                target: "reconcile_watchdog::stack",
                tid,
                size = stack.ss_size,
                needed = needed(),
                "the thread's alternate signal stack is too small for the capture's \
                 handler: one that fits replaces it until the thread ends, when it is put back"
            );
        }
    }
    READY.lock().unwrap_or_else(|p| p.into_inner()).push(tid);
    prepared.tid = Some(tid);
    prepared
}

/// Whether thread `tid` is recorded as having an alternate signal stack; `None` when
/// the list could not be read (see [`super::lock_briefly`]: the monitor calls this).
pub(crate) fn is_ready(tid: u32) -> Option<bool> {
    super::lock_briefly(&READY).map(|ready| ready.contains(&tid))
}

impl Drop for AltStack {
    fn drop(&mut self) {
        // The record first: no capture signals the thread from here on. A signal sent
        // just before still finds the stack, or, once it is disabled, the thread's own
        // (a handler that runs completes before the thread goes on to the release).
        if let Some(tid) = self.tid {
            let mut ready = READY.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = ready.iter().position(|t| *t == tid) {
                ready.swap_remove(at);
            }
        }
        let Some((start, len)) = self.ours else {
            return;
        };
        // Released only if it is still the thread's, and not in use: a stack someone
        // replaced ours with may have saved ours to put back, so ours is then left
        // mapped (a few pages, once per such thread) rather than risk a handler on
        // unmapped memory.
        let Some(now) = current() else {
            return;
        };
        if now.ss_sp as usize != start + page_size() || now.ss_flags & libc::SS_ONSTACK != 0 {
            return;
        }
        let disable = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // The embedder's own stack back where ours replaced one.
        let next = self.theirs.as_ref().unwrap_or(&disable);
        // SAFETY: `next` is a valid `stack_t`: disabled, or the thread's own stack as
        // `sigaltstack` reported it, whose memory its owner keeps; a null old stack is
        // allowed.
        if unsafe { libc::sigaltstack(next, std::ptr::null_mut()) } != 0 {
            return;
        }
        // SAFETY: `start..start + len` is the mapping `install` made, no longer the
        // thread's alternate stack and used by nothing else.
        unsafe {
            libc::munmap(start as *mut libc::c_void, len);
        }
    }
}

/// The calling thread's alternate signal stack, as `sigaltstack` reports it.
fn current() -> Option<libc::stack_t> {
    let mut stack = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: with a null new stack `sigaltstack` only writes `stack`, a valid `stack_t`.
    (unsafe { libc::sigaltstack(std::ptr::null(), &mut stack) } == 0).then_some(stack)
}

/// Maps a stack with a guard page below it and makes it the calling thread's alternate
/// signal stack: the mapping's start and length.
fn install() -> Option<(usize, usize)> {
    let page = page_size();
    let size = (libc::SIGSTKSZ + HANDLER_ROOM)
        .max(needed())
        .next_multiple_of(page);
    let len = size + page;
    // SAFETY: an anonymous private mapping at an address the kernel chooses.
    let start = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if start == libc::MAP_FAILED {
        return None;
    }
    // The lowest page catches an overflow of the alternate stack as a fault instead of
    // a write into whatever lies below.
    // SAFETY: the first page of the mapping just made.
    let guarded = unsafe { libc::mprotect(start, page, libc::PROT_NONE) } == 0;
    let stack = libc::stack_t {
        ss_sp: start.wrapping_byte_add(page),
        ss_flags: 0,
        ss_size: size,
    };
    // SAFETY: `stack` describes `size` writable bytes of the mapping, which stays mapped
    // until the drop of the `AltStack` that owns it has disabled it.
    if !guarded || unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) } != 0 {
        // SAFETY: the mapping just made, used by nothing.
        unsafe { libc::munmap(start, len) };
        return None;
    }
    Some((start as usize, len))
}

fn page_size() -> usize {
    // SAFETY: `sysconf` has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

fn gettid() -> Option<u32> {
    // SAFETY: gettid is a system call without arguments or preconditions.
    u32::try_from(unsafe { libc::syscall(libc::SYS_gettid) }).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Disables the calling thread's alternate signal stack, whoever installed it (the
    /// standard library's is released by it at the thread's end, disabled or not).
    pub(crate) fn drop_alternate_stack() {
        let disable = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: `disable` is a valid `stack_t`; a null old stack is allowed.
        assert_eq!(
            unsafe { libc::sigaltstack(&disable, std::ptr::null_mut()) },
            0
        );
    }

    /// Whether the calling thread has an alternate signal stack.
    pub(crate) fn has_alternate_stack() -> bool {
        current().is_some_and(|s| s.ss_flags & libc::SS_DISABLE == 0)
    }

    #[test]
    fn a_thread_without_an_alternate_stack_gets_one_until_it_ends() {
        let (tid, installed) = std::thread::spawn(|| {
            drop_alternate_stack();
            assert!(!has_alternate_stack());
            let tid = gettid().unwrap();
            assert_eq!(is_ready(tid), Some(false));
            let prepared = prepare();
            assert!(has_alternate_stack(), "installed");
            assert_eq!(is_ready(tid), Some(true));
            let installed = prepared.ours.is_some();
            drop(prepared);
            assert!(!has_alternate_stack(), "released with its owner");
            assert_eq!(is_ready(tid), Some(false));
            // Held for the thread's life this time, as the guard's threads hold it.
            thread_local! {
                static HELD: AltStack = prepare();
            }
            HELD.with(|_| ());
            (tid, installed)
        })
        .join()
        .unwrap();
        assert!(installed);
        assert_eq!(is_ready(tid), Some(false), "withdrawn at the thread's end");
    }

    #[test]
    fn the_monitor_gives_up_on_the_list_while_a_thread_holds_it() {
        let tid = gettid().unwrap();
        let held = READY.lock().unwrap();
        assert_eq!(is_ready(tid), None, "not waited for");
        drop(held);
        assert!(is_ready(tid).is_some());
    }

    #[test]
    fn a_thread_with_too_small_an_alternate_stack_gets_one_that_fits_and_its_own_back() {
        std::thread::spawn(|| {
            let mut theirs = vec![0u8; 2048];
            let stack = libc::stack_t {
                ss_sp: theirs.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: theirs.len(),
            };
            // SAFETY: `theirs` outlives the stack's use: it is disabled below first.
            assert_eq!(
                unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) },
                0
            );
            let prepared = prepare();
            assert!(
                prepared.ours.is_some(),
                "replaced: 2 KiB is below {}",
                needed()
            );
            let now = current().unwrap();
            assert!(now.ss_size >= needed(), "{} bytes", now.ss_size);
            assert_eq!(is_ready(gettid().unwrap()), Some(true));
            drop(prepared);
            let back = current().unwrap();
            assert_eq!(back.ss_sp, theirs.as_mut_ptr().cast(), "put back");
            assert_eq!(back.ss_size, 2048);
            drop_alternate_stack();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_with_an_alternate_stack_keeps_its_own() {
        std::thread::spawn(|| {
            let mut theirs = vec![0u8; 64 * 1024];
            let stack = libc::stack_t {
                ss_sp: theirs.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: theirs.len(),
            };
            // SAFETY: `theirs` outlives the stack's use: it is disabled below first.
            assert_eq!(
                unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) },
                0
            );
            let prepared = prepare();
            assert!(prepared.ours.is_none(), "not replaced");
            assert_eq!(is_ready(gettid().unwrap()), Some(true));
            drop(prepared);
            assert_eq!(
                current().unwrap().ss_sp,
                theirs.as_mut_ptr().cast(),
                "left in place"
            );
            drop_alternate_stack();
        })
        .join()
        .unwrap();
    }
}
