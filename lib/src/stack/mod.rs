//! The native stack and kernel state of a thread stuck inside a poll.
//!
//! The kernel state (`kernel.rs`) reads `/proc/self/task/<tid>/` and needs no privilege beyond being
//! the same process. [`capture`] never interrupts a thread blocked in the kernel: it
//! unwinds such a thread from the registers the kernel shows for it (`parked.rs`,
//! x86_64). Only a thread seen running in user space (a busy loop), and known to have
//! an alternate signal stack (`alt_stack.rs`), is sent a signal, whose handler copies
//! its registers and keeps it stopped while its stack is copied (`signal.rs`). Either
//! way the stack is unwound on the calling thread by the one unwinder (`unwind.rs`, each
//! step vouched for by `vouch.rs`), checked against the guard's poll frame
//! (`anchor.rs`), and symbols are resolved there too (`symbols.rs`); `capture.rs` takes
//! those steps in order, and this module holds what they return. All of it is behind
//! the `stack-capture` feature, Linux only. Where capture is unavailable, reports fall
//! back to the thread's name and kernel state.

#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(crate) mod alt_stack;
pub(crate) mod anchor;
mod capture;
mod kernel;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod maps;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod parked;
#[cfg(all(test, feature = "stack-capture", target_os = "linux"))]
mod robustness;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod signal;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod symbols;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod unwind;
#[cfg(all(
    feature = "stack-capture",
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod vouch;

use std::fmt;
use std::time::{Duration, Instant};

pub(crate) use kernel::KernelState;

/// The most frames one capture keeps.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const MAX_FRAMES: usize = 128;

/// Errors of reading a thread's stack or state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This build or platform cannot capture stacks.
    #[error("stack capture is unavailable: {0}")]
    Unsupported(&'static str),
    /// The thread does not exist (any more) in this process.
    #[error("no thread {tid} in this process")]
    NoSuchThread {
        /// The kernel thread id.
        tid: u32,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The application ignores the capture signal or handles it itself: it is left
    /// alone, and running threads are not captured.
    #[error("signal {signal} is {owner}; stack capture of running threads is off")]
    SignalTaken {
        /// The signal number.
        signal: i32,
        /// Who has it.
        owner: &'static str,
    },
    /// [`set_capture_signal`] refused the signal.
    #[error("signal {signal} cannot be the stack capture signal: {reason}")]
    SignalUnusable {
        /// The signal number.
        signal: i32,
        /// Why not.
        reason: &'static str,
    },
    /// Installing the signal handler failed.
    #[error("failed to install the stack capture signal handler")]
    Install(#[source] std::io::Error),
    /// Sending the signal failed.
    #[error("failed to signal thread {tid}")]
    Signal {
        /// The kernel thread id.
        tid: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another capture held the capture lock until this one's deadline.
    #[error("another stack capture was in progress until the deadline")]
    Busy,
    /// A thread entering or leaving the capture's list of `what` held it for longer
    /// than the capture waits.
    #[error("the list of {what} was locked by a thread entering or leaving it")]
    Contended {
        /// Which list.
        what: &'static str,
    },
    /// The capture's deadline passed before it was done.
    #[error("the capture deadline passed while {doing} for thread {tid}")]
    Deadline {
        /// The kernel thread id.
        tid: u32,
        /// What the capture was doing.
        doing: &'static str,
    },
    /// The signal handler let its thread go before the stack was copied (the capture
    /// was not scheduled for that long): the copy may be of a stack that has moved on.
    #[error(
        "thread {tid} left the signal handler before its stack was copied (held {held:?} at most); the copy was discarded"
    )]
    LeftHandler {
        /// The kernel thread id.
        tid: u32,
        /// How long the handler holds its thread at most.
        held: Duration,
    },
    /// Reading this process's memory map (`/proc/self/maps`) failed.
    #[error("failed to read this process's memory map")]
    Maps(#[source] std::io::Error),
    /// Copying the thread's stack through `/proc/self/mem` failed.
    #[error("failed to copy the stack of thread {tid}")]
    StackRead {
        /// The kernel thread id.
        tid: u32,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The thread moved each time its stack was read from the kernel's registers.
    #[error("thread {tid} kept waking while its stack was read; no consistent stack")]
    KeptMoving {
        /// The kernel thread id.
        tid: u32,
    },
    /// The thread's `syscall` file could not be read, so whether it is blocked is not
    /// known, and a signal could interrupt a system call it is blocked in: it is left
    /// alone.
    #[error(
        "failed to read where thread {tid} is (/proc/self/task/{tid}/syscall); not signalling it"
    )]
    Whereabouts {
        /// The kernel thread id.
        tid: u32,
        /// Why `/proc/self/task/<tid>/syscall` could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The thread is blocked in the kernel, and this architecture cannot unwind it from
    /// outside; a signal would interrupt the blocking call, so none is sent.
    #[error(
        "thread {tid} is blocked in the kernel, which this architecture cannot unwind without interrupting it"
    )]
    BlockedUnwindUnsupported {
        /// The kernel thread id.
        tid: u32,
    },
    /// The thread is running, but not known to have an alternate signal stack for the
    /// capture's handler (threads the guard polls on get one): it is not signalled.
    #[error(
        "thread {tid} has no alternate signal stack known to the capture, or none large enough (the guard gives one to the threads it polls on); not signalling it"
    )]
    NoAlternateStack {
        /// The kernel thread id.
        tid: u32,
    },
    /// The thread did not run its handler in time (the signal is blocked on it, or it
    /// is stopped).
    #[error("thread {tid} did not run the capture signal's handler in time")]
    Timeout {
        /// The kernel thread id.
        tid: u32,
    },
    /// This poll's stack was captured for an earlier report of the same hang.
    #[error("captured once per hang: see the first report of this hang")]
    AlreadyCaptured,
    /// The poll ended (or another began) while the stack was captured: the stack may be
    /// another code path's, so it is not shown.
    #[error("the poll ended during the capture; the stack was discarded as stale")]
    Stale,
    /// The unwinder found no frames.
    #[error("the unwinder found no frames")]
    Empty,
}

impl Error {
    /// Whether a capture that failed this way may succeed if tried again later: another
    /// capture or a registering thread held a lock, the deadline passed, the thread kept waking, did not run
    /// the handler in time or left it early.
    pub(crate) fn may_pass(&self) -> bool {
        matches!(
            self,
            Self::Busy
                | Self::Contended { .. }
                | Self::Deadline { .. }
                | Self::LeftHandler { .. }
                | Self::KeptMoving { .. }
                | Self::Timeout { .. }
        )
    }
}

/// One frame of a captured stack: an instruction pointer and what it resolved to.
/// A call inlined into its caller shares its caller's pointer and appears as a frame
/// of its own, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The instruction pointer.
    pub ip: usize,
    /// The demangled function name, when the binary has symbols.
    pub function: Option<String>,
    /// The source file, when the binary has line tables (toolchain and registry
    /// prefixes shortened).
    pub file: Option<String>,
    /// The line in `file`.
    pub line: Option<u32>,
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.function {
            Some(function) => f.write_str(function)?,
            None => write!(f, "{:#x}", self.ip)?,
        }
        if let Some(file) = &self.file {
            write!(f, " at {file}")?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
        }
        Ok(())
    }
}

/// How a stack was captured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// Unwound from the registers the kernel saved for a thread blocked in it: the
    /// thread was not disturbed.
    #[default]
    Kernel,
    /// Unwound from the registers a signal handler recorded on a thread running in
    /// user space, and a copy of its stack made while the handler held it.
    Signal,
}

/// A thread's native stack, innermost frame first, starting where the thread was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack {
    /// The frames resolved.
    pub frames: Vec<Frame>,
    /// How many outer frames were captured but left unresolved (a capture stops
    /// resolving at the first frame its caller marks as the last).
    pub left_out: usize,
    /// How it was captured.
    pub method: Method,
    /// Why the unwind stopped before the thread's outermost frame, when it did (a
    /// frame without unwind information, a step that could not be vouched for, a walk
    /// that did not go through the guard's poll frame): the frames shown are still right.
    pub stopped_early: Option<String>,
    /// Whether the guard's poll frame could not be read for the thread (it was in no
    /// guarded poll, or its registration could not be read in time): the walk was then
    /// not checked against it, and ends where a step would need that check.
    pub poll_frame_unread: bool,
    /// The files whose frames above show addresses or bare names for want of
    /// symbols, with what resolves them offline.
    pub missing_symbols: Vec<MissingSymbols>,
}

/// A file whose frames could not be given files and lines: its executable has no
/// symbol file beside it (`FILE.gsym`, docs/diagnostics.md) or it has no symbols.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MissingSymbols {
    /// The file's path.
    pub file: String,
    /// Its GNU build id (hex), which names the build whose symbols resolve it.
    pub build_id: Option<String>,
    /// The addresses of its frames within the file (as its symbols name them), in
    /// the stack's order.
    pub addresses: Vec<u64>,
}

impl fmt::Display for MissingSymbols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addresses: Vec<String> = self.addresses.iter().map(|a| format!("{a:#x}")).collect();
        let addresses = addresses.join(" ");
        write!(f, "no symbol file for {}", self.file)?;
        if let Some(id) = &self.build_id {
            write!(f, " (build id {id})")?;
        }
        write!(
            f,
            "; its frames are at {addresses}: `addr2line -Cfipe FILE {addresses}` with the \
             unstripped binary of that build, or `llvm-gsymutil --address=ADDRESS FILE.gsym`"
        )
    }
}

impl Stack {
    /// Whether any frame's function name contains `needle`.
    #[must_use]
    pub fn mentions(&self, needle: &str) -> bool {
        self.frames
            .iter()
            .any(|f| f.function.as_deref().is_some_and(|n| n.contains(needle)))
    }
}

/// One frame per line, numbered from the innermost.
impl fmt::Display for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, frame) in self.frames.iter().enumerate() {
            if n > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{n:>3}: {frame}")?;
        }
        if self.left_out > 0 {
            write!(f, "\n     ... {} outer frames left out", self.left_out)?;
        }
        if let Some(reason) = &self.stopped_early {
            write!(f, "\n     ({reason})")?;
        }
        if self.poll_frame_unread {
            f.write_str(
                "\n     (not checked against the guard's poll frame, which could not be read)",
            )?;
        }
        for missing in &self.missing_symbols {
            write!(f, "\n     ({missing})")?;
        }
        match self.method {
            Method::Kernel => f.write_str(
                "\n     (unwound from the kernel's registers of the blocked thread; it was not interrupted)",
            ),
            Method::Signal => {
                f.write_str("\n     (recorded by a signal to the thread, which was running)")
            }
        }
    }
}

/// A source path without the parts that are the same on every machine: the
/// toolchain's hash directory and the cargo registry's index directory.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn short_path(path: &std::path::Path) -> String {
    let path = path.display().to_string();
    if path.starts_with("/rustc/")
        && let Some(at) = path.find("/library/")
    {
        return format!("rust{}", &path[at..]);
    }
    if let Some(at) = path.find("/registry/src/") {
        let rest = &path[at + "/registry/src/".len()..];
        if let Some(slash) = rest.find('/') {
            return rest[slash + 1..].to_owned();
        }
    }
    path
}

/// A thread's readiness for the capture signal (its alternate signal stack), held by the
/// thread for its life: see [`prepare_thread`].
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(crate) use alt_stack::AltStack;

/// Without stack capture, nothing to hold.
#[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
#[derive(Debug)]
pub(crate) struct AltStack;

/// Makes the calling thread one that a capture may signal while it runs: gives it an
/// alternate signal stack when it has none. Called once per thread (by the guard, at the
/// thread's first guarded poll); the thread keeps what it returns until it ends.
pub(crate) fn prepare_thread() -> AltStack {
    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    return alt_stack::prepare();
    #[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
    AltStack
}

/// Returns to the kernel the heap that resolving symbols freed: call it once a batch
/// of captures is done. Resolving keeps nothing between stacks.
pub fn release_symbols() {
    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    symbols::release();
}

/// Captures the native stack of thread `tid` of this process, waiting at most
/// `timeout` for it, and resolves every frame. A thread running in user space is
/// captured only if a guarded reconcile has been polled on it (which gives it the
/// alternate signal stack the capture's handler runs on); another is
/// [`Error::NoAlternateStack`].
pub fn capture(tid: u32, timeout: Duration) -> Result<Stack, Error> {
    capture_until(tid, timeout, |_| false)
}

/// Makes `signal` the signal that captures of running threads send (by default
/// `SIGURG`, whose default action is to be ignored), and installs its handler now. Call
/// it before the watchdog starts: the first capture installs the handler for the default
/// signal otherwise, and the choice is fixed from then on (a choice and a first capture
/// at once cannot disagree). Only `SIGURG`, `SIGUSR1`, `SIGUSR2` and the real-time
/// signals can be chosen. A signal the application ignores or handles itself is left
/// alone; running threads are then not captured. A real-time signal
/// (`libc::SIGRTMIN() + n`) that nothing else uses is a good choice; its default action
/// terminates the process, which only matters should something reset its handler.
///
/// # Errors
///
/// [`Error::SignalUnusable`] for a signal that is not one of those, or once the handler
/// is installed for another signal; [`Error::SignalTaken`] when the application ignores
/// or handles it; [`Error::Install`] when the handler cannot be installed;
/// [`Error::Unsupported`] where stacks are not captured.
pub fn set_capture_signal(signal: i32) -> Result<(), Error> {
    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    return signal::choose(signal);
    #[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
    {
        let _ = signal;
        Err(Error::Unsupported(if cfg!(target_os = "linux") {
            "built without the stack-capture feature"
        } else {
            "only on Linux"
        }))
    }
}

/// How many times [`lock_briefly`] tries a lock before it gives up.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const LOCK_TRIES: usize = 100;

/// Takes `lock` if it comes free within a few tries. For the monitor, which must not
/// wait on the threads it watches: they hold the capture's registries only to enter or
/// leave them (a push or a removal), so a few tries are enough, and a thread stopped
/// while holding one (by a debugger, say) costs a capture, never the monitor its scan.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(crate) fn lock_briefly<T>(lock: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    (0..LOCK_TRIES).find_map(|_| match lock.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => {
            std::thread::yield_now();
            None
        }
    })
}

/// Like [`capture`], keeping frames from the innermost out only up to the first that
/// `is_last` picks: what lies below a known frame is often the same every time.
/// Symbols are resolved on the calling thread, never in the signal handler.
pub(crate) fn capture_until(
    tid: u32,
    timeout: Duration,
    is_last: impl Fn(&Frame) -> bool,
) -> Result<Stack, Error> {
    capture::capture_impl(tid, Instant::now() + timeout, &is_last, &|| {})
}

/// What is known of one thread at a hang: its stack where it could be captured, its
/// kernel state where it could be read.
#[derive(Debug)]
pub(crate) struct ThreadDiagnostics {
    /// The kernel thread id.
    pub(crate) tid: u32,
    /// The native stack, or why there is none.
    pub(crate) stack: Result<Stack, Error>,
    /// The kernel's view, or why there is none.
    pub(crate) kernel: Result<KernelState, Error>,
}

impl ThreadDiagnostics {
    /// Reads the kernel state of thread `tid` and captures its stack as
    /// [`capture`] does, resolving up to the first frame `is_last` accepts and waiting
    /// at most `timeout` for the stack.
    #[must_use]
    pub(crate) fn of(tid: u32, timeout: Duration, is_last: impl Fn(&Frame) -> bool) -> Self {
        // The kernel state first: were a signal sent, it is what the thread was doing
        // before.
        let kernel = KernelState::read(tid);
        let stack = capture_until(tid, timeout, is_last);
        Self { tid, stack, kernel }
    }
}

#[cfg(all(test, feature = "stack-capture", target_os = "linux"))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, mpsc};

    use super::*;

    pub(super) const TIMEOUT: Duration = Duration::from_secs(5);

    #[inline(never)]
    fn blocked_on_a_held_lock(lock: &Mutex<()>) {
        drop(lock.lock().unwrap());
    }

    #[inline(never)]
    fn spinning_without_a_break(stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    }

    /// Runs `body` on a thread of its own and returns its kernel tid once it has
    /// started.
    pub(super) fn thread_running(
        body: impl FnOnce() + Send + 'static,
    ) -> (u32, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            let _ready = alt_stack::prepare();
            tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
            body();
        });
        (rx.recv().unwrap(), handle)
    }

    /// Captures until `found` holds (the thread may not have reached the interesting
    /// frame yet), failing after a generous bound.
    pub(super) fn capture_eventually(tid: u32, found: impl Fn(&Stack) -> bool) -> Stack {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match capture(tid, TIMEOUT) {
                Ok(stack) if found(&stack) => return stack,
                Ok(stack) => assert!(Instant::now() < deadline, "never found; last:\n{stack}"),
                // The capturing thread was not scheduled for the whole hold (a loaded
                // machine): tried again.
                Err(err @ Error::LeftHandler { .. }) => {
                    assert!(Instant::now() < deadline, "{err}");
                }
                Err(err) => panic!("{err}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_thread_blocked_on_a_lock_shows_the_lock_and_its_caller() {
        let lock = Arc::new(Mutex::new(()));
        let held = lock.lock().unwrap();
        let (tid, handle) = {
            let lock = Arc::clone(&lock);
            thread_running(move || blocked_on_a_held_lock(&lock))
        };
        let stack = capture_eventually(tid, |s| s.mentions("blocked_on_a_held_lock"));
        assert!(stack.mentions("lock"), "{stack}");
        assert_eq!(
            stack.method,
            Method::Kernel,
            "a blocked thread is not signalled"
        );
        // Nothing of a signal handler in it: the stack starts in the lock.
        assert!(!stack.mentions("on_signal"), "{stack}");
        assert_eq!(stack.left_out, 0);
        assert_eq!(stack.stopped_early, None, "{stack}");

        // Resolving can stop at a known frame; the rest is only counted.
        let is_caller = |f: &Frame| {
            f.function
                .as_deref()
                .is_some_and(|n| n.contains("blocked_on_a_held_lock"))
        };
        let short = capture_until(tid, TIMEOUT, is_caller).unwrap();
        assert!(is_caller(short.frames.last().unwrap()), "{short}");
        assert!(short.left_out > 0, "{short}");
        assert!(
            short.to_string().contains(&format!(
                "\n     ... {} outer frames left out\n",
                short.left_out
            )),
            "{short}"
        );
        drop(held);
        handle.join().unwrap();
    }

    #[test]
    fn a_spinning_thread_shows_its_loop() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tid, handle) = {
            let stop = Arc::clone(&stop);
            thread_running(move || spinning_without_a_break(&stop))
        };
        let stack = capture_eventually(tid, |s| s.mentions("spinning_without_a_break"));
        assert_eq!(
            stack.method,
            Method::Signal,
            "a running thread is signalled"
        );
        // From the registers the signal recorded, the unwind reaches the thread's root.
        assert_eq!(stack.stopped_early, None, "{stack}");
        assert!(stack.mentions("std::thread"), "{stack}");
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_running_thread_with_a_2_kib_alternate_stack_of_its_own_is_captured_on_one_that_fits() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let handle = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut theirs = vec![0u8; 2048];
                let small = libc::stack_t {
                    ss_sp: theirs.as_mut_ptr().cast(),
                    ss_flags: 0,
                    ss_size: theirs.len(),
                };
                // SAFETY: `theirs` outlives the stack's use: it is disabled below first.
                assert_eq!(
                    unsafe { libc::sigaltstack(&small, std::ptr::null_mut()) },
                    0
                );
                let ready = alt_stack::prepare();
                tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
                spinning_without_a_break(&stop);
                drop(ready);
                alt_stack::tests::drop_alternate_stack();
                drop(theirs);
            })
        };
        let tid = rx.recv().unwrap();
        // A handler on the 2 KiB stack would overflow it (the kernel's signal frame alone
        // is larger on CPUs with wide vector registers) and kill the process.
        let stack = capture_eventually(tid, |s| s.mentions("spinning_without_a_break"));
        assert_eq!(stack.method, Method::Signal, "{stack}");
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    #[test]
    fn a_running_thread_without_an_alternate_stack_is_not_signalled() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let handle = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                alt_stack::tests::drop_alternate_stack();
                tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
                spinning_without_a_break(&stop);
            })
        };
        let tid = rx.recv().unwrap();
        let err = capture(tid, TIMEOUT).expect_err("not signalled");
        assert!(matches!(err, Error::NoAlternateStack { .. }), "{err}");
        assert!(err.to_string().contains("alternate signal stack"), "{err}");
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    /// Runs `body` inside the poll of a guarded reconcile on a thread of its own.
    fn guarded_thread(body: impl FnOnce() + Send + 'static) -> (u32, std::thread::JoinHandle<()>) {
        thread_running(move || {
            let registry = crate::guard::Registry::new(Duration::from_secs(60));
            let mut body = Some(body);
            let reconcile = std::future::poll_fn(move |_| {
                (body.take().expect("polled once"))();
                std::task::Poll::Ready(Ok::<(), ()>(()))
            });
            let guarded = std::pin::pin!(
                registry
                    .controller("stack", "Widget")
                    .guard(crate::guard::ObjectKey::cluster("a"), reconcile)
            );
            let polled =
                guarded.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
            assert!(polled.is_ready());
        })
    }

    #[test]
    fn a_stack_through_the_guards_poll_is_whole() {
        let lock = Arc::new(Mutex::new(()));
        let held = lock.lock().unwrap();
        let (tid, handle) = {
            let lock = Arc::clone(&lock);
            guarded_thread(move || blocked_on_a_held_lock(&lock))
        };
        // The poll frame is read before the unwind: a capture that read it before the
        // thread entered its poll, and unwound it once blocked, is tried again.
        let stack = capture_eventually(tid, |s| {
            s.mentions("blocked_on_a_held_lock") && !s.poll_frame_unread
        });
        assert!(anchor::of(tid).is_some(), "the poll's frame is recorded");
        assert!(stack.mentions("guard::guarded::Guarded"), "{stack}");
        assert_eq!(stack.stopped_early, None, "{stack}");
        drop(held);
        handle.join().unwrap();
        assert_eq!(anchor::of(tid), None, "withdrawn with the thread");
    }

    /// Blocks with the thread's poll frame recorded in this function's frame, as if the
    /// guard's poll were here: an unwind that goes through it finds another function.
    #[inline(never)]
    fn blocked_under_a_false_poll_frame(lock: &Mutex<()>) {
        let here = 0_u8;
        anchor::enter(std::hint::black_box(&raw const here).addr());
        blocked_on_a_held_lock(lock);
        std::hint::black_box(&here);
    }

    #[test]
    fn a_stack_that_does_not_go_through_the_guards_poll_is_cut_where_it_left_it() {
        let lock = Arc::new(Mutex::new(()));
        let held = lock.lock().unwrap();
        let (tid, handle) = {
            let lock = Arc::clone(&lock);
            thread_running(move || {
                let _anchor = anchor::Anchor::register(crate::guard::kernel_tid());
                blocked_under_a_false_poll_frame(&lock);
            })
        };
        // As above: a capture that read the poll frame before the thread recorded it is
        // tried again.
        let stack = capture_eventually(tid, |s| {
            s.mentions("blocked_on_a_held_lock") && !s.poll_frame_unread
        });
        assert!(
            !stack.mentions("blocked_under_a_false_poll_frame"),
            "{stack}"
        );
        assert!(!stack.mentions("std::thread"), "{stack}");
        let why = stack.stopped_early.as_deref().unwrap_or_default();
        assert!(
            why.contains("did not go through the guard's poll frame"),
            "{stack}"
        );
        drop(held);
        handle.join().unwrap();
    }

    #[inline(never)]
    fn spinning_on_the_clock(stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            std::hint::black_box(Instant::now());
        }
    }

    #[test]
    fn a_thread_spinning_on_the_clock_keeps_its_caller() {
        // Most of its time is in the vDSO's clock_gettime: unwound by the vDSO's own
        // tables, its stack goes on to the loop that calls it.
        let stop = Arc::new(AtomicBool::new(false));
        let (tid, handle) = {
            let stop = Arc::clone(&stop);
            thread_running(move || spinning_on_the_clock(&stop))
        };
        let mut stacks = 0;
        // Generous: on a loaded machine most captures may time out (below).
        let deadline = Instant::now() + Duration::from_secs(120);
        while stacks < 20 && Instant::now() < deadline {
            match capture(tid, TIMEOUT) {
                Ok(stack) => {
                    assert!(stack.mentions("spinning_on_the_clock"), "{stack}");
                    stacks += 1;
                }
                // A loaded machine: the capturing thread was not scheduled in time.
                Err(Error::LeftHandler { .. } | Error::Timeout { .. }) => {}
                Err(err) => panic!("{err}"),
            }
        }
        assert_eq!(stacks, 20, "20 stacks within 120 s");
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    /// Mostly running, but blocking in short sleeps between bursts of work.
    #[inline(never)]
    fn mostly_running(stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let burst = Instant::now();
            while burst.elapsed() < Duration::from_millis(1) {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_micros(10));
        }
    }

    #[test]
    fn a_thread_that_blocks_between_the_looks_is_not_signalled() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tid, handle) = {
            let stop = Arc::clone(&stop);
            thread_running(move || mostly_running(&stop))
        };
        // Seen running at every look it mostly is; the count of its
        // voluntary switches tells it blocked in between. (A thread that is runnable
        // but not scheduled for all the looks, on a loaded machine, does not switch:
        // that one may still be signalled, so the bound is loose.)
        let mut signalled = 0;
        for _ in 0..20 {
            match capture(tid, Duration::from_millis(500)) {
                Ok(stack) if stack.method == Method::Signal => signalled += 1,
                Ok(_) => {}
                Err(err) => assert!(matches!(err, Error::KeptMoving { .. }), "{err}"),
            }
        }
        assert!(signalled <= 5, "signalled {signalled} times of 20");
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    #[test]
    fn a_thread_that_does_not_exist_is_an_error_not_a_wait() {
        // Above any pid_max, so never a live thread of this process.
        let tid = i32::MAX as u32;
        let started = Instant::now();
        let err = capture(tid, TIMEOUT).unwrap_err();
        assert!(matches!(err, Error::NoSuchThread { .. }), "{err}");
        assert!(
            started.elapsed() < TIMEOUT,
            "no wait for a thread that is not there"
        );
        let diagnostics = ThreadDiagnostics::of(tid, Duration::from_millis(50), |_| false);
        assert!(matches!(
            diagnostics.kernel,
            Err(Error::NoSuchThread { .. })
        ));
        assert!(diagnostics.stack.is_err());
    }
}
