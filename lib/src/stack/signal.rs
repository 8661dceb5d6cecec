//! Captures a running thread's native stack: a signal to it, an unwind inside the
//! handler into a preallocated buffer, and nothing else there. (A thread blocked in the
//! kernel is never signalled: see the `parked` module.)
//!
//! The only module of the crate allowed `unsafe`. The handler does only what is
//! async-signal-safe: atomic loads and stores, `gettid`, and `_Unwind_Backtrace` (which
//! on glibc 2.35+ with libgcc 12+ finds unwind tables through the lock-free
//! `_dl_find_object`; older systems take the loader lock there, see
//! docs/diagnostics.md). It never allocates, formats or symbolizes: the caller does that
//! on its own thread from the instruction pointers left here. Every wait of the caller
//! is bounded, so a handler that never runs (signal blocked, thread gone) or never
//! finishes costs one timeout, not a stalled watchdog.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use super::Error;

/// The most frames one capture keeps.
pub(super) const MAX_FRAMES: usize = 128;

/// The signal used: SIGURG, whose default action is to be ignored (Go's runtime
/// preempts goroutines with it for that reason). Should anything reset its handler to
/// the default, a capture is lost, not the process; a real-time signal's default would
/// terminate it. SIGURG is otherwise only sent for out-of-band socket data to a process
/// that asked for it (`F_SETOWN`). A handler already installed for it is never replaced,
/// and the handler is checked before each send.
const SIGNAL: c_int = libc::SIGURG;

// The capture's life: the caller arms it, the handler on the target thread claims it
// (ARMED -> WRITING) and completes it (DONE); the caller reads it and goes back to
// IDLE, or withdraws an armed capture that timed out (ARMED -> IDLE).
const IDLE: u64 = 0;
const ARMED: u64 = 1;
const WRITING: u64 = 2;
const DONE: u64 = 3;
const PHASE_BITS: u32 = 8;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;

/// The phase of the capture and the kernel tid it is for, in one word, so that a
/// handler claims it only if it is armed *for its own thread*, in one atomic step (a
/// late signal from an earlier capture must not fill in a later one).
static STATE: AtomicU64 = AtomicU64::new(IDLE);

fn state(tid: u32, phase: u64) -> u64 {
    (u64::from(tid) << PHASE_BITS) | phase
}
static FRAMES: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static LEN: AtomicUsize = AtomicUsize::new(0);
/// The instruction pointer the signal interrupted, 0 when this platform cannot tell.
static PC: AtomicUsize = AtomicUsize::new(0);
/// One capture at a time in the process: the buffer is shared by every monitor.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
static INSTALLED: OnceLock<Result<c_int, InstallFailure>> = OnceLock::new();
/// Captures refused because an earlier one is stuck in the handler's unwinder.
static STUCK_REFUSALS: AtomicU64 = AtomicU64::new(0);

/// How many captures were refused because an earlier one never left the handler's
/// unwinder.
pub(super) fn stuck_refusals() -> u64 {
    STUCK_REFUSALS.load(Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug)]
enum InstallFailure {
    Taken(c_int),
    Os(i32),
}

/// What the handler left: instruction pointers from the handler outwards, and the
/// interrupted one.
pub(super) struct Raw {
    pub(super) frames: Vec<usize>,
    pub(super) pc: Option<usize>,
}

/// Signals thread `tid` of this process and waits, at most until `deadline`, for its
/// handler to record its stack.
pub(super) fn capture(tid: u32, deadline: Instant) -> Result<Raw, Error> {
    let signal = install()?;
    let target = i32::try_from(tid).map_err(|_| Error::NoSuchThread {
        tid,
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    let _one = loop {
        match ONE_AT_A_TIME.try_lock() {
            Ok(guard) => break guard,
            Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                return Err(Error::Busy);
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    // A handler that finished after its capture gave up left DONE behind; one still
    // WRITING is stuck inside the unwinder, and the buffer stays its own.
    let current = STATE.load(Ordering::Acquire);
    match current & PHASE_MASK {
        IDLE => {}
        DONE => {
            // Only this function leaves IDLE, and it holds the lock: no race.
            STATE.store(IDLE, Ordering::Release);
        }
        _ => {
            STUCK_REFUSALS.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Stuck);
        }
    }
    if !still_ours(signal) {
        return Err(Error::SignalTaken { signal });
    }
    LEN.store(0, Ordering::Relaxed);
    PC.store(0, Ordering::Relaxed);
    STATE.store(state(tid, ARMED), Ordering::Release);

    // SAFETY: tgkill takes plain integers and touches no memory of ours; `getpid` has
    // no preconditions. A tid that has exited (or belongs to no thread of this process)
    // fails with ESRCH instead of reaching another process.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), target, signal) };
    if sent != 0 {
        let source = std::io::Error::last_os_error();
        STATE.store(IDLE, Ordering::Release);
        return Err(Error::Signal { tid, source });
    }

    loop {
        if STATE.load(Ordering::Acquire) == state(tid, DONE) {
            let len = LEN.load(Ordering::Relaxed).min(MAX_FRAMES);
            let frames = FRAMES[..len]
                .iter()
                .map(|f| f.load(Ordering::Relaxed))
                .collect();
            let pc = PC.load(Ordering::Relaxed);
            STATE.store(IDLE, Ordering::Release);
            return Ok(Raw {
                frames,
                pc: (pc != 0).then_some(pc),
            });
        }
        if Instant::now() >= deadline {
            // Withdraw, unless the handler has claimed it meanwhile; then it is either
            // done at the next look or stuck, and the next capture finds out which.
            if STATE
                .compare_exchange(state(tid, ARMED), IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
                || STATE.load(Ordering::Acquire) != state(tid, DONE)
            {
                return Err(Error::Timeout { tid });
            }
            continue;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn install() -> Result<c_int, Error> {
    let installed = *INSTALLED.get_or_init(|| {
        let signal = SIGNAL;
        // SAFETY: an all-zero `sigaction` is a valid value of the C struct (no handler,
        // empty mask, no flags); with a null new action `sigaction` only writes `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `old` is a valid, writable `sigaction`.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } != 0 {
            return Err(InstallFailure::Os(last_errno()));
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            return Err(InstallFailure::Taken(signal));
        }
        // SAFETY: as above, all-zero is a valid `sigaction` to fill in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        // Only running threads are signalled, but one may enter a blocking call before
        // the signal lands: SA_RESTART makes the calls the kernel can restart resume
        // (docs/diagnostics.md lists those it cannot). No SA_ONSTACK, so the
        // unwind runs on the thread's own (large) stack, not the small alternate one.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: `action.sa_mask` is a valid `sigset_t` to initialise; `action` is a
        // fully initialised `sigaction` whose handler is the `extern "C"` function
        // below, which has the signature SA_SIGINFO requires.
        let status = unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if status != 0 {
            return Err(InstallFailure::Os(last_errno()));
        }
        Ok(signal)
    });
    installed.map_err(|failure| match failure {
        InstallFailure::Taken(signal) => Error::SignalTaken { signal },
        InstallFailure::Os(errno) => Error::Install(std::io::Error::from_raw_os_error(errno)),
    })
}

/// Whether the handler installed for `signal` is still ours: something may have
/// replaced it since (or reset it to the default) without telling us.
fn still_ours(signal: c_int) -> bool {
    // SAFETY: as in `install`, all-zero is a valid `sigaction`, and with a null new
    // action `sigaction` only writes `current`.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `current` is a valid, writable `sigaction`.
    let status = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) };
    status == 0 && current.sa_sigaction == on_signal as *const () as libc::sighandler_t
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The signal handler, on the target thread: records its stack if a capture for this
/// very thread is armed, and nothing else.
extern "C" fn on_signal(_signal: c_int, _info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for
    // the thread's life; the handler restores it so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    record_if_armed_for_this_thread(context);
    // SAFETY: as above, this thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

fn record_if_armed_for_this_thread(context: *mut c_void) {
    // SAFETY: gettid is a system call without arguments or preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let Ok(tid) = u32::try_from(tid) else {
        return;
    };
    if STATE
        .compare_exchange(
            state(tid, ARMED),
            state(tid, WRITING),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_err()
    {
        return;
    }
    PC.store(interrupted_pc(context), Ordering::Relaxed);
    let mut len = 0;
    // SAFETY: unwinds the current thread's own stack, live for the whole call. The
    // variant is unsafe only because it skips the crate's global lock, which a signal
    // handler must not take (the interrupted code may hold it). The closure only stores
    // into preallocated atomics: no allocation, no formatting, and no panic (the index
    // is checked).
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            if let Some(slot) = FRAMES.get(len) {
                slot.store(frame.ip() as usize, Ordering::Relaxed);
                len += 1;
            }
            len < MAX_FRAMES
        });
    }
    LEN.store(len, Ordering::Relaxed);
    STATE.store(state(tid, DONE), Ordering::Release);
}

/// The instruction pointer saved in the signal's context: where the thread was.
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
fn interrupted_pc(context: *mut c_void) -> usize {
    if context.is_null() {
        return 0;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a valid `ucontext_t` as the third
    // argument, alive for the handler's duration; we only read one register.
    unsafe {
        let context = &*context.cast::<libc::ucontext_t>();
        context.uc_mcontext.gregs[libc::REG_RIP as usize] as usize
    }
}

#[cfg(all(target_arch = "aarch64", target_env = "gnu"))]
fn interrupted_pc(context: *mut c_void) -> usize {
    if context.is_null() {
        return 0;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a valid `ucontext_t` as the third
    // argument, alive for the handler's duration; we only read the pc.
    unsafe {
        let context = &*context.cast::<libc::ucontext_t>();
        context.uc_mcontext.pc as usize
    }
}

#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_env = "gnu"
)))]
fn interrupted_pc(_context: *mut c_void) -> usize {
    0
}

/// Held by every test of this binary that sends the capture signal, so that none finds
/// another's capture in progress.
#[cfg(test)]
pub(super) static SIGNAL_TESTS: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Runs `body` on a new thread with every signal blocked, and returns its tid.
    fn thread_with_signals_blocked(
        body: impl FnOnce() + Send + 'static,
    ) -> (u32, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            // SAFETY: `all` is a valid `sigset_t` to fill; pthread_sigmask only changes
            // the calling thread's mask.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
            body();
        });
        (rx.recv().unwrap(), handle)
    }

    #[test]
    fn a_thread_that_never_runs_the_handler_costs_one_timeout_and_no_more() {
        let _serial = SIGNAL_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (tid, blocked) = thread_with_signals_blocked(move || {
            let _ = stop_rx.recv();
        });
        let timeout = Duration::from_millis(100);
        let started = Instant::now();
        let err = capture(tid, Instant::now() + timeout)
            .err()
            .expect("no stack");
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(started.elapsed() < timeout * 50, "bounded by the timeout");
        // Withdrawn, not left armed: a late handler cannot fill in a later capture.
        assert_eq!(STATE.load(Ordering::Acquire), IDLE);

        // The withdrawn capture leaves nothing behind: the next one, of a thread that
        // does take signals, works.
        let (tid_tx, tid_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let normal = std::thread::spawn(move || {
            tid_tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
            let _ = go_rx.recv();
        });
        let normal_tid = tid_rx.recv().unwrap();
        let raw = capture(normal_tid, Instant::now() + Duration::from_secs(5))
            .unwrap_or_else(|err| panic!("{err}"));
        assert!(!raw.frames.is_empty());
        drop(go_tx);
        normal.join().unwrap();
        drop(stop_tx);
        blocked.join().unwrap();
    }
}

#[cfg(test)]
mod stuck {
    use super::*;

    #[test]
    fn a_capture_stuck_in_the_handler_is_refused_as_stuck_and_counted() {
        let _serial = SIGNAL_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        install().expect("the handler installs");
        let before = stuck_refusals();
        // As a handler that never left the unwinder leaves it.
        STATE.store(state(1, WRITING), Ordering::Release);
        let err = capture(1, Instant::now() + Duration::from_secs(5))
            .err()
            .expect("refused");
        STATE.store(IDLE, Ordering::Release);
        assert!(matches!(err, Error::Stuck), "{err}");
        assert!(err.to_string().contains("never left the unwinder"), "{err}");
        assert_eq!(stuck_refusals(), before + 1);
        assert_eq!(crate::stack::stuck_captures(), before + 1);
    }
}

/// A capture must not change what it observes: threads blocked in calls that no
/// `SA_RESTART` restarts are not interrupted by one, and their stacks are still shown.
#[cfg(test)]
mod blocked_calls {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::thread::JoinHandle;

    use super::*;
    use crate::stack::{Method, Stack};

    /// One blocking call, made again and again, each lasting `BLOCK_MS` unless a
    /// signal cuts it short.
    #[derive(Clone, Copy, Debug)]
    enum Call {
        ReadWithTimeout,
        Poll,
        Nanosleep,
    }

    const BLOCK_MS: u64 = 300;

    #[inline(never)]
    fn blocked_in_read_with_timeout(socket: &UdpSocket) -> bool {
        let mut buf = [0; 16];
        matches!(socket.recv(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::Interrupted)
    }

    #[inline(never)]
    fn blocked_in_poll(socket: &UdpSocket) -> bool {
        let mut fd = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `fd` is one valid `pollfd`, alive for the call, and the count is 1.
        let n = unsafe { libc::poll(&mut fd, 1, BLOCK_MS as c_int) };
        n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    }

    #[inline(never)]
    fn blocked_in_nanosleep() -> bool {
        let duration = libc::timespec {
            tv_sec: 0,
            tv_nsec: (BLOCK_MS * 1_000_000) as libc::c_long,
        };
        // SAFETY: `duration` is a valid timespec; a null remainder is allowed.
        let n = unsafe { libc::nanosleep(&duration, std::ptr::null_mut()) };
        n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    }

    impl Call {
        fn function(self) -> &'static str {
            match self {
                Self::ReadWithTimeout => "blocked_in_read_with_timeout",
                Self::Poll => "blocked_in_poll",
                Self::Nanosleep => "blocked_in_nanosleep",
            }
        }
    }

    /// A thread making `call` until stopped, counting the calls a signal interrupted.
    struct Blocked {
        tid: u32,
        interrupted: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Blocked {
        fn start(call: Call) -> Self {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("a loopback socket");
            socket
                .set_read_timeout(Some(Duration::from_millis(BLOCK_MS)))
                .expect("a read timeout");
            let interrupted = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            let thread = {
                let (interrupted, stop) = (Arc::clone(&interrupted), Arc::clone(&stop));
                std::thread::spawn(move || {
                    tid_tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        let eintr = match call {
                            Call::ReadWithTimeout => blocked_in_read_with_timeout(&socket),
                            Call::Poll => blocked_in_poll(&socket),
                            Call::Nanosleep => blocked_in_nanosleep(),
                        };
                        if eintr {
                            interrupted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            };
            Self {
                tid: tid_rx.recv().unwrap(),
                interrupted,
                stop,
                thread: Some(thread),
            }
        }

        fn interrupted(&self) -> usize {
            self.interrupted.load(Ordering::Relaxed)
        }
    }

    impl Drop for Blocked {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(thread) = self.thread.take() {
                thread.join().expect("the blocked thread did not panic");
            }
        }
    }

    /// Captures `blocked` until its stack shows `call`'s function (it may not be in the
    /// call yet), failing after a generous bound.
    fn stack_showing(blocked: &Blocked, call: Call) -> Stack {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stack = crate::stack::capture(blocked.tid, Duration::from_secs(5));
            if let Ok(stack) = &stack
                && stack.mentions(call.function())
            {
                return stack.clone();
            }
            assert!(Instant::now() < deadline, "{call:?} never shown: {stack:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn captures_do_not_interrupt_blocked_calls_and_show_their_stacks() {
        for call in [Call::ReadWithTimeout, Call::Poll, Call::Nanosleep] {
            let blocked = Blocked::start(call);
            for _ in 0..10 {
                let stack = stack_showing(&blocked, call);
                assert_eq!(stack.method, Method::Kernel, "{call:?}:\n{stack}");
                assert!(stack.mentions("blocked_calls"), "{call:?}:\n{stack}");
            }
            assert_eq!(blocked.interrupted(), 0, "{call:?} was interrupted");
        }
    }

    #[test]
    fn a_signal_does_interrupt_them_which_is_what_the_count_would_show() {
        let _serial = SIGNAL_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let blocked = Blocked::start(Call::Nanosleep);
        let deadline = Instant::now() + Duration::from_secs(10);
        while blocked.interrupted() == 0 {
            assert!(Instant::now() < deadline, "never interrupted");
            let _ = capture(blocked.tid, Instant::now() + Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
