//! Stops a running thread just long enough to copy its stack: a signal to it, whose
//! handler copies the interrupted registers into preallocated atomics and waits, a
//! bounded time, while the caller copies the stack. (A thread blocked in the kernel is
//! never signalled: see `parked.rs`.)
//!
//! The handler does only what is async-signal-safe: atomic loads, stores and
//! compare-exchanges, `gettid`, `clock_gettime` and `futex`, all on memory that is
//! always valid. It never unwinds, allocates, locks or formats: the caller unwinds the
//! copy on its own thread (`unwind.rs`). It runs on the thread's
//! alternate signal stack, so a thread at the end of its stack is not pushed over it:
//! only a thread known to have one is signalled (see the `alt_stack` module). Every
//! wait on either side is bounded: a handler that never runs (signal blocked, thread
//! stopped or gone) costs the caller one timeout, and a caller that never comes back
//! costs the thread [`MAX_HOLD`] at most.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Error;
use super::unwind::Registers;

/// The signal used unless [`choose`] picked another: SIGURG, whose default action is to
/// be ignored (Go's runtime preempts goroutines with it for that reason). Should
/// anything reset its handler to the default, a capture is lost, not the process; a
/// real-time signal's default would terminate it. SIGURG is otherwise only sent for
/// out-of-band socket data to a process that asked for it (`F_SETOWN`).
pub(super) const DEFAULT_SIGNAL: c_int = libc::SIGURG;

/// How long the handler keeps its thread stopped at most, waiting for the caller to
/// copy the stack (a copy takes well under a millisecond; this is for a caller that is not
/// scheduled).
pub(super) const MAX_HOLD: Duration = Duration::from_millis(50);

// A capture's life, in one word with the kernel tid it is for, so that a handler
// claims it only if it is armed *for its own thread*, in one atomic step (a late signal
// from an earlier capture must not fill in a later one): the caller arms it
// (`arm`: ARMED); the handler claims it (RECORDING), copies the registers and keeps
// its thread stopped (STOPPED, `wait_for_release`) while the caller, which waited for
// that (`Armed::wait_for_registers`), copies the stack and releases it
// (`Armed::release`: -> IDLE), or until MAX_HOLD passes (-> GAVE_UP). The caller
// returns the word to IDLE whatever happened. A u32 so that the handler can
// wait on it with `futex`; tids are below 2^22 (the kernel's PID_MAX_LIMIT).
const IDLE: u32 = 0;
const ARMED: u32 = 1;
const RECORDING: u32 = 2;
const STOPPED: u32 = 3;
const GAVE_UP: u32 = 4;
const PHASE_BITS: u32 = 3;
static STATE: AtomicU32 = AtomicU32::new(IDLE);

fn state(tid: u32, phase: u32) -> u32 {
    (tid << PHASE_BITS) | phase
}

static PC: AtomicU64 = AtomicU64::new(0);
static SP: AtomicU64 = AtomicU64::new(0);
static FP: AtomicU64 = AtomicU64::new(0);
static LR: AtomicU64 = AtomicU64::new(0);

/// The signal in use, chosen and installed at once (by `choose`, or by the first
/// capture with the default): a choice cannot race an installation.
static INSTALLED: OnceLock<(c_int, Result<c_int, InstallFailure>)> = OnceLock::new();
/// Whether the application's taking over of the signal was logged (once per process).
static TAKEN_LOGGED: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, Debug)]
enum InstallFailure {
    Taken(c_int, Owner),
    Os(i32),
}

/// Who has the signal, when it is not this module.
#[derive(Clone, Copy, Debug)]
enum Owner {
    Ignored,
    Handler,
    Default,
    /// Querying its disposition failed: not known to be ours.
    Unknown,
}

impl Owner {
    fn describe(self) -> &'static str {
        match self {
            Self::Ignored => "ignored by the application (SIG_IGN)",
            Self::Handler => "handled by the application's own handler",
            Self::Default => "reset to its default action since it was installed",
            Self::Unknown => "of a disposition that could not be read (sigaction failed)",
        }
    }
}

/// Makes `signal` the capture signal and installs its handler. Only before the first
/// capture (or choice) installed the handler for another signal.
pub(super) fn choose(signal: c_int) -> Result<(), Error> {
    let unusable = |reason| Err(Error::SignalUnusable { signal, reason });
    if signal <= 0 || signal > libc::SIGRTMAX() {
        return unusable("no such signal");
    }
    if [libc::SIGKILL, libc::SIGSTOP].contains(&signal) {
        return unusable("it cannot be caught");
    }
    if [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGABRT,
    ]
    .contains(&signal)
    {
        return unusable("it reports faults, which must keep their own handling");
    }
    // The others have meanings of their own (a terminal's, a child's, a timer's, a
    // broken pipe's...) that something in the process may rely on.
    let free = [libc::SIGURG, libc::SIGUSR1, libc::SIGUSR2].contains(&signal)
        || (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&signal);
    if !free {
        return unusable("only SIGURG, SIGUSR1, SIGUSR2 and the real-time signals can be");
    }
    let (tried, installed) = *INSTALLED.get_or_init(|| (signal, install_for(signal)));
    if tried != signal {
        return unusable("a capture already used another signal; choose before the first");
    }
    installed.map(|_| ()).map_err(describe_failure)
}

/// A capture armed for one thread: sends it the signal, waits for its registers and
/// releases it. Dropping it withdraws the capture and releases the thread, whatever
/// the handler has got to.
pub(super) struct Armed {
    tid: u32,
    signal: c_int,
}

/// Arms a capture of thread `tid`. The caller serialises captures (one at a time in the
/// process: the registers' atomics are shared).
pub(super) fn arm(tid: u32) -> Result<Armed, Error> {
    if !cfg!(all(
        target_env = "gnu",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )) {
        return Err(Error::Unsupported(
            "reading a running thread's registers is implemented for x86_64 and aarch64 glibc only",
        ));
    }
    let signal = install()?;
    if let Some(owner) = owner_if_not_ours(signal) {
        if !TAKEN_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "reconcile_watchdog::stack",
                signal,
                "the stack capture signal is {}: capture of running threads is off",
                owner.describe()
            );
        }
        return Err(Error::SignalTaken {
            signal,
            owner: owner.describe(),
        });
    }
    match super::alt_stack::is_ready(tid) {
        Some(true) => {}
        Some(false) => return Err(Error::NoAlternateStack { tid }),
        None => {
            return Err(Error::Contended {
                what: "threads with an alternate signal stack",
            });
        }
    }
    if tid >= 1 << (32 - PHASE_BITS) {
        return Err(Error::NoSuchThread {
            tid,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    }
    // Every capture leaves IDLE behind, and the caller serialises them.
    STATE.store(state(tid, ARMED), Ordering::Release);
    Ok(Armed { tid, signal })
}

impl Armed {
    /// Sends the signal.
    pub(super) fn send(&self) -> Result<(), Error> {
        let target = i32::try_from(self.tid).map_err(|_| Error::NoSuchThread {
            tid: self.tid,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        // SAFETY: tgkill takes plain integers and touches no memory of ours; `getpid`
        // has no preconditions. A tid that has exited (or belongs to no thread of this
        // process) fails with ESRCH instead of reaching another process.
        let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), target, self.signal) };
        if sent != 0 {
            let source = std::io::Error::last_os_error();
            // ESRCH: no such thread in this process (it has exited).
            if source.raw_os_error() == Some(libc::ESRCH) {
                return Err(Error::NoSuchThread {
                    tid: self.tid,
                    source,
                });
            }
            return Err(Error::Signal {
                tid: self.tid,
                source,
            });
        }
        Ok(())
    }

    /// The caller's side: waits, at most until `deadline`, for the handler to have
    /// stopped its thread, and gives the registers it was interrupted at.
    pub(super) fn wait_for_registers(&self, deadline: Instant) -> Result<Registers, Error> {
        let stopped = state(self.tid, STOPPED);
        loop {
            let now = STATE.load(Ordering::Acquire);
            if now == state(self.tid, GAVE_UP) {
                return Err(Error::LeftHandler {
                    tid: self.tid,
                    held: MAX_HOLD,
                });
            }
            if now == stopped {
                let lr = LR.load(Ordering::Relaxed);
                return Ok(Registers {
                    pc: PC.load(Ordering::Relaxed),
                    sp: SP.load(Ordering::Relaxed),
                    fp: Some(FP.load(Ordering::Relaxed)),
                    lr: cfg!(target_arch = "aarch64").then_some(lr),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout { tid: self.tid });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Lets the thread go: whether it was still held, so that what was copied since
    /// [`Self::wait_for_registers`] is the stack it was interrupted with.
    pub(super) fn release(self) -> bool {
        STATE
            .compare_exchange(
                state(self.tid, STOPPED),
                IDLE,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        // Drop wakes the handler.
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        STATE.store(IDLE, Ordering::Release);
        wake_handler();
    }
}

fn install() -> Result<c_int, Error> {
    let (_, installed) = *INSTALLED.get_or_init(|| (DEFAULT_SIGNAL, install_for(DEFAULT_SIGNAL)));
    installed.map_err(describe_failure)
}

/// Installs the handler for `signal`, unless the application ignores or handles it.
fn install_for(signal: c_int) -> Result<c_int, InstallFailure> {
    {
        // SAFETY: an all-zero `sigaction` is a valid value of the C struct (no handler,
        // empty mask, no flags); with a null new action `sigaction` only writes `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `old` is a valid, writable `sigaction`.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) } != 0 {
            return Err(InstallFailure::Os(last_errno()));
        }
        // The application's choice for the signal, ignoring it included, is left alone.
        if old.sa_sigaction == libc::SIG_IGN {
            return Err(InstallFailure::Taken(signal, Owner::Ignored));
        }
        if old.sa_sigaction != libc::SIG_DFL {
            return Err(InstallFailure::Taken(signal, Owner::Handler));
        }
        // SAFETY: as above, all-zero is a valid `sigaction` to fill in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        // SA_ONSTACK: the kernel's signal frame goes on the alternate stack where the
        // thread has one, not on what is left of a stack that may be nearly full.
        // SA_RESTART: a thread is signalled only when seen running, but should it have
        // entered a call since, the calls the kernel can restart resume
        // (docs/diagnostics.md lists those it cannot).
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
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
    }
}

/// The error of a failed installation (an application's handler logged once).
fn describe_failure(failure: InstallFailure) -> Error {
    match failure {
        InstallFailure::Taken(signal, owner) => {
            if !TAKEN_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "reconcile_watchdog::stack",
                    signal,
                    "the stack capture signal is {}: capture of running threads is off",
                    owner.describe()
                );
            }
            Error::SignalTaken {
                signal,
                owner: owner.describe(),
            }
        }
        InstallFailure::Os(errno) => Error::Install(std::io::Error::from_raw_os_error(errno)),
    }
}

/// Who has `signal` now, when it is no longer this module's handler: something may
/// have replaced it since (or reset it to the default) without telling us.
fn owner_if_not_ours(signal: c_int) -> Option<Owner> {
    // SAFETY: as in `install`, all-zero is a valid `sigaction`, and with a null new
    // action `sigaction` only writes `current`.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `current` is a valid, writable `sigaction`.
    if unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } != 0 {
        return Some(Owner::Unknown);
    }
    match current.sa_sigaction {
        handler if handler == on_signal as *const () as libc::sighandler_t => None,
        libc::SIG_IGN => Some(Owner::Ignored),
        libc::SIG_DFL => Some(Owner::Default),
        _ => Some(Owner::Handler),
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Wakes a handler waiting in [`wait_for_release`].
fn wake_handler() {
    // SAFETY: FUTEX_WAKE on the address of a static atomic, valid for the whole
    // process; the other arguments are ignored for this operation.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            STATE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// The signal handler, on the target thread: if a capture for this very thread is
/// armed, records the registers and holds the thread until released, and nothing else.
extern "C" fn on_signal(_signal: c_int, _info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for
    // the thread's life; the handler restores it so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    record_and_wait_for_release(context);
    // SAFETY: as above, this thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

fn record_and_wait_for_release(context: *mut c_void) {
    // SAFETY: gettid is a system call without arguments or preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let Ok(tid) = u32::try_from(tid) else {
        return;
    };
    if tid >= 1 << (32 - PHASE_BITS)
        || STATE
            .compare_exchange(
                state(tid, ARMED),
                state(tid, RECORDING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return;
    }
    let Some((pc, sp, fp, lr)) = interrupted_registers(context) else {
        // Nothing to give: withdraw the claim (the caller times out).
        let _ = STATE.compare_exchange(
            state(tid, RECORDING),
            state(tid, GAVE_UP),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        return;
    };
    PC.store(pc, Ordering::Relaxed);
    SP.store(sp, Ordering::Relaxed);
    FP.store(fp, Ordering::Relaxed);
    LR.store(lr, Ordering::Relaxed);
    // The caller may have withdrawn meanwhile: then there is no one to hold for.
    if STATE
        .compare_exchange(
            state(tid, RECORDING),
            state(tid, STOPPED),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        wait_for_release(state(tid, STOPPED), state(tid, GAVE_UP));
    }
}

/// The handler's side: keeps its thread stopped while the word is `stopped` (until the
/// caller's release), at most [`MAX_HOLD`]; then marks it `gave_up`, so that the caller
/// knows its copy may be of a stack that has moved on.
fn wait_for_release(stopped: u32, gave_up: u32) {
    let Some(until) = monotonic_ns().map(|now| now + MAX_HOLD.as_nanos() as u64) else {
        let _ = STATE.compare_exchange(stopped, gave_up, Ordering::AcqRel, Ordering::Relaxed);
        return;
    };
    loop {
        if STATE.load(Ordering::Acquire) != stopped {
            return;
        }
        let now = monotonic_ns().unwrap_or(u64::MAX);
        if now >= until {
            let _ = STATE.compare_exchange(stopped, gave_up, Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
        let left_ns = until - now;
        let timeout = libc::timespec {
            tv_sec: (left_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (left_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on the address of a static atomic, valid for the whole
        // process, with a valid relative timeout; it returns at once if the word is no
        // longer `stopped`, on a wake, on the timeout or on a signal, and the loop looks
        // again each time.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                STATE.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                stopped,
                &raw const timeout,
            );
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (`clock_gettime` is async-signal-safe).
fn monotonic_ns() -> Option<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return None;
    }
    Some(u64::try_from(now.tv_sec).ok()? * 1_000_000_000 + u64::try_from(now.tv_nsec).ok()?)
}

/// The interrupted pc, sp, frame pointer and link register (0 on x86_64) saved in the
/// signal's context.
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
fn interrupted_registers(context: *mut c_void) -> Option<(u64, u64, u64, u64)> {
    if context.is_null() {
        return None;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a valid `ucontext_t` as the third
    // argument, alive for the handler's duration; we only read three registers.
    let gregs = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    #[allow(clippy::cast_sign_loss)] // registers, stored as i64 by the C struct
    Some((
        gregs[libc::REG_RIP as usize] as u64,
        gregs[libc::REG_RSP as usize] as u64,
        gregs[libc::REG_RBP as usize] as u64,
        0,
    ))
}

#[cfg(all(target_arch = "aarch64", target_env = "gnu"))]
fn interrupted_registers(context: *mut c_void) -> Option<(u64, u64, u64, u64)> {
    if context.is_null() {
        return None;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a valid `ucontext_t` as the third
    // argument, alive for the handler's duration; we only read four registers.
    let mcontext = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext };
    Some((
        mcontext.pc,
        mcontext.sp,
        mcontext.regs[29],
        mcontext.regs[30],
    ))
}

#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_env = "gnu"
)))]
fn interrupted_registers(_context: *mut c_void) -> Option<(u64, u64, u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, MutexGuard, mpsc};

    use super::*;
    use crate::stack::unwind::Unwinder;

    fn one_capture_at_a_time() -> MutexGuard<'static, Unwinder> {
        crate::stack::capture::CAPTURE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `body` on a new thread, with every signal blocked when `blocked`, and
    /// returns its tid.
    fn thread(
        blocked: bool,
        body: impl FnOnce() + Send + 'static,
    ) -> (u32, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            if blocked {
                // SAFETY: `all` is a valid `sigset_t` to fill; pthread_sigmask only
                // changes the calling thread's mask.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                }
            }
            let _ready = crate::stack::alt_stack::prepare();
            tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
            body();
        });
        (rx.recv().unwrap(), handle)
    }

    /// A thread counting as it spins, until `stop`.
    fn spinner() -> (
        u32,
        Arc<AtomicUsize>,
        Arc<AtomicBool>,
        std::thread::JoinHandle<()>,
    ) {
        let spins = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tid, handle) = {
            let (spins, stop) = (Arc::clone(&spins), Arc::clone(&stop));
            thread(false, move || {
                while !stop.load(Ordering::Relaxed) {
                    spins.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        (tid, spins, stop, handle)
    }

    #[test]
    fn a_thread_that_never_runs_the_handler_costs_one_timeout_and_no_more() {
        let _one = one_capture_at_a_time();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (tid, blocked) = thread(true, move || {
            let _ = stop_rx.recv();
        });
        let timeout = Duration::from_millis(100);
        let started = Instant::now();
        let armed = arm(tid).expect("armed");
        armed.send().expect("sent");
        let err = armed
            .wait_for_registers(Instant::now() + timeout)
            .expect_err("no stack");
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(started.elapsed() < timeout * 50, "bounded by the timeout");
        drop(armed);
        // Withdrawn, not left armed: a late handler cannot fill in a later capture.
        assert_eq!(STATE.load(Ordering::Acquire), IDLE);

        // The withdrawn capture leaves nothing behind: the next one, of a thread that
        // does take signals, gets registers and holds the thread until released.
        let (tid, spins, stop, spinning) = spinner();
        let armed = arm(tid).expect("armed");
        armed.send().expect("sent");
        let registers = armed
            .wait_for_registers(Instant::now() + Duration::from_secs(5))
            .unwrap_or_else(|err| panic!("{err}"));
        assert!(registers.pc != 0 && registers.sp != 0, "{registers:?}");
        let during = spins.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(spins.load(Ordering::Relaxed), during, "held still");
        assert!(armed.release(), "still held when released");
        stop.store(true, Ordering::Relaxed);
        spinning.join().unwrap();
        drop(stop_tx);
        blocked.join().unwrap();
    }

    #[test]
    fn a_handler_holds_its_thread_no_longer_than_the_hold_and_says_so() {
        let _one = one_capture_at_a_time();
        let (tid, spins, stop, spinning) = spinner();
        let armed = arm(tid).expect("armed");
        armed.send().expect("sent");
        armed
            .wait_for_registers(Instant::now() + Duration::from_secs(5))
            .unwrap_or_else(|err| panic!("{err}"));
        let during = spins.load(Ordering::Relaxed);
        // A caller that is not scheduled for longer than the hold.
        std::thread::sleep(MAX_HOLD * 3);
        let deadline = Instant::now() + Duration::from_secs(10);
        while spins.load(Ordering::Relaxed) == during {
            assert!(Instant::now() < deadline, "the thread was never let go");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !armed.release(),
            "it left before the release: a copy would be stale"
        );
        assert_eq!(STATE.load(Ordering::Acquire), IDLE);
        stop.store(true, Ordering::Relaxed);
        spinning.join().unwrap();
    }

    #[test]
    fn a_signal_the_application_ignores_or_handles_is_left_alone() {
        let _one = one_capture_at_a_time();
        let signal = install().expect("installed");
        let (tid, _spins, stop, spinning) = spinner();
        for (disposition, owner) in [(libc::SIG_IGN, "ignored"), (libc::SIG_DFL, "default")] {
            // SAFETY: all-zero is a valid `sigaction`; `ours` is written by the first
            // call and put back by the second, so the handler is ours again after.
            unsafe {
                let mut ours: libc::sigaction = std::mem::zeroed();
                let mut theirs: libc::sigaction = std::mem::zeroed();
                theirs.sa_sigaction = disposition;
                assert_eq!(libc::sigaction(signal, &theirs, &mut ours), 0);
                let err = arm(tid).err().expect("refused");
                assert_eq!(libc::sigaction(signal, &ours, std::ptr::null_mut()), 0);
                assert!(
                    matches!(err, Error::SignalTaken { owner: o, .. } if o.contains(owner)),
                    "{err}"
                );
            }
        }
        assert_eq!(STATE.load(Ordering::Acquire), IDLE, "never armed");
        assert!(arm(tid).is_ok(), "ours again");
        stop.store(true, Ordering::Relaxed);
        spinning.join().unwrap();
    }

    #[test]
    fn signalling_a_thread_that_has_ended_is_no_such_thread() {
        let _one = one_capture_at_a_time();
        install().expect("installed");
        let (end, ended) = mpsc::channel::<()>();
        let (tid, handle) = thread(false, move || {
            let _ = ended.recv();
        });
        // Armed while it lives; it ends before the signal.
        let armed = arm(tid).expect("armed");
        drop(end);
        handle.join().unwrap();
        let err = armed.send().expect_err("no thread to signal");
        assert!(matches!(err, Error::NoSuchThread { .. }), "{err}");
        drop(armed);
        // Once ended, it is not armed for at all: it has no alternate stack any more.
        let err = arm(tid).err().expect("refused");
        assert!(matches!(err, Error::NoAlternateStack { .. }), "{err}");
    }

    #[test]
    fn only_a_signal_that_can_be_caught_and_reports_no_fault_can_be_chosen() {
        let installed = install().expect("installed");
        // Those that do not exist, cannot be caught, report faults, or mean something
        // else (a hang-up, an interrupt, a child's end, a broken pipe, a timer).
        for signal in [
            0,
            -1,
            libc::SIGRTMAX() + 1,
            libc::SIGKILL,
            libc::SIGSEGV,
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGCHLD,
            libc::SIGPIPE,
            libc::SIGALRM,
            libc::SIGWINCH,
        ] {
            let err = choose(signal).expect_err("refused");
            assert!(matches!(err, Error::SignalUnusable { .. }), "{err}");
        }
        assert!(choose(installed).is_ok(), "the one in use");
        let other = if installed == libc::SIGUSR2 {
            libc::SIGUSR1
        } else {
            libc::SIGUSR2
        };
        let err = choose(other).expect_err("too late");
        assert!(err.to_string().contains("before the first"), "{err}");
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
                    let _ready = crate::stack::alt_stack::prepare();
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
        let blocked = Blocked::start(Call::Nanosleep);
        let deadline = Instant::now() + Duration::from_secs(10);
        while blocked.interrupted() == 0 {
            assert!(Instant::now() < deadline, "never interrupted");
            {
                let _one = crate::stack::capture::CAPTURE
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let armed = arm(blocked.tid).expect("armed");
                armed.send().expect("sent");
                let _ = armed.wait_for_registers(Instant::now() + Duration::from_secs(5));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
