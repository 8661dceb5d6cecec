//! The native stack and kernel state of a thread stuck inside a poll.
//!
//! [`KernelState`] reads `/proc/self/task/<tid>/` and needs no privilege beyond being
//! the same process. [`capture`] never interrupts a thread blocked in the kernel: it
//! unwinds such a thread from the registers the kernel shows for it (the `parked`
//! module, x86_64). Only a thread running in user space (a busy loop), which no signal
//! can interrupt in a system call, is sent a signal whose handler records its
//! instruction pointers (the `signal` module, the only `unsafe` code of the crate).
//! Both are behind the `stack-capture` feature, Linux only; symbols are resolved
//! afterwards on the calling thread. Where capture is unavailable, reports fall back
//! to the thread's name and kernel state.

mod kernel;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod parked;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod signal;
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
mod symbols;

use std::fmt;
use std::time::{Duration, Instant};

pub use kernel::KernelState;

/// How many stack captures were refused because an earlier one never left the signal
/// handler's unwinder ([`Error::Stuck`]): from the first, signal capture is off.
#[must_use]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))] // the metrics' alone
pub(crate) fn stuck_captures() -> u64 {
    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    return signal::stuck_refusals();
    #[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
    0
}

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
    /// Another handler owns the capture signal.
    #[error("signal {signal} already has a handler; stack capture is off")]
    SignalTaken {
        /// The signal number.
        signal: i32,
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
    /// Another capture is in progress.
    #[error("another stack capture is in progress")]
    Busy,
    /// An earlier signal capture never left the unwinder in the signal handler: the
    /// buffer stays its own, so signal capture is off for the life of the process.
    #[error(
        "an earlier stack capture never left the unwinder in its signal handler; capture of running threads is off"
    )]
    Stuck,
    /// The thread moved each time its stack was read from the kernel's registers.
    #[error("thread {tid} kept waking while its stack was read; no consistent stack")]
    KeptMoving {
        /// The kernel thread id.
        tid: u32,
    },
    /// The kernel does not say where the thread is, and a signal could interrupt a
    /// system call it is blocked in: it is left alone.
    #[error("cannot tell whether thread {tid} is blocked; not signalling it")]
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
    /// The thread did not run its handler in time (the signal is blocked on it, or it
    /// is stopped).
    #[error("thread {tid} did not record its stack in time")]
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
    /// The unwinder found no frames (beyond the signal handler's own).
    #[error("the unwinder found no frames")]
    Empty,
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
    /// Recorded by a signal handler on a thread running in user space.
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

/// Returns to the kernel the heap that resolving symbols freed: call it once a batch
/// of captures is done. Resolving keeps nothing between stacks.
pub fn release_symbols() {
    #[cfg(all(feature = "stack-capture", target_os = "linux"))]
    symbols::release();
}

/// Captures the native stack of thread `tid` of this process, waiting at most
/// `timeout` for it, and resolves every frame.
pub fn capture(tid: u32, timeout: Duration) -> Result<Stack, Error> {
    capture_until(tid, timeout, |_| false)
}

/// Like [`capture`], keeping frames from the innermost out only up to the first that
/// `is_last` picks: what lies below a known frame is often the same every time.
/// Symbols are resolved on the calling thread, never in the signal handler.
pub(crate) fn capture_until(
    tid: u32,
    timeout: Duration,
    is_last: impl Fn(&Frame) -> bool,
) -> Result<Stack, Error> {
    capture_impl(tid, Instant::now() + timeout, &is_last)
}

#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn capture_impl(
    tid: u32,
    deadline: Instant,
    is_last: &dyn Fn(&Frame) -> bool,
) -> Result<Stack, Error> {
    let (addresses, method) = match whereabouts(tid)? {
        parked::Whereabouts::Parked(at) => (unwind_parked(tid, at)?, Method::Kernel),
        parked::Whereabouts::Running => (signalled(tid, deadline)?, Method::Signal),
    };
    let started = Instant::now();
    // Each file's symbols are opened once per stack.
    let lookups: Vec<(usize, usize)> = addresses.iter().map(|a| (a.ip, a.lookup)).collect();
    let symbols = symbols::resolve(&lookups, is_last);
    let resolved = symbols.frames.len();
    let frames: Vec<Frame> = symbols.frames.iter().flatten().cloned().collect();
    // What a stack costs the monitor, for docs/performance.md.
    tracing::debug!(
        target: "reconcile_watchdog::stack",
        resolved,
        frames = frames.len(),
        took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "stack symbolized"
    );
    if frames.is_empty() {
        return Err(Error::Empty);
    }
    Ok(Stack {
        frames,
        left_out: addresses.len() - resolved,
        method,
        missing_symbols: symbols.missing(resolved),
    })
}

/// How many times, a millisecond apart, a thread must be seen running before it is
/// signalled: a thread that is mostly blocked (a loop of short reads or sleeps) is
/// then caught blocked and unwound from outside, not signalled as it enters a call.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const RUNNING_LOOKS: usize = 5;

/// Where thread `tid` is: blocked, or running at each of [`RUNNING_LOOKS`] looks.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn whereabouts(tid: u32) -> Result<parked::Whereabouts, Error> {
    for look in 1..=RUNNING_LOOKS {
        match parked::whereabouts(tid) {
            Ok(parked::Whereabouts::Running) if look < RUNNING_LOOKS => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(found) => return Ok(found),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoSuchThread { tid, source });
            }
            Err(source) => return Err(Error::Whereabouts { tid, source }),
        }
    }
    Ok(parked::Whereabouts::Running)
}

/// The frames of a thread blocked in the kernel, unwound from outside.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn unwind_parked(tid: u32, at: parked::Parked) -> Result<Vec<parked::Address>, Error> {
    match parked::unwind(tid, at, signal::MAX_FRAMES) {
        Ok(addresses) => Ok(addresses),
        Err(parked::Failure::KeptMoving | parked::Failure::Running) => {
            Err(Error::KeptMoving { tid })
        }
        Err(parked::Failure::Io(source)) if source.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::NoSuchThread { tid, source })
        }
        Err(parked::Failure::Io(source)) => Err(Error::Whereabouts { tid, source }),
        Err(parked::Failure::Unsupported) => Err(Error::BlockedUnwindUnsupported { tid }),
    }
}

/// The frames of a running thread, recorded by its signal handler: from where the
/// signal interrupted it, without the handler's and the trampoline's frames.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn signalled(tid: u32, deadline: Instant) -> Result<Vec<parked::Address>, Error> {
    let raw = signal::capture(tid, deadline)?;
    let ips = match raw
        .pc
        .and_then(|pc| raw.frames.iter().position(|ip| *ip == pc))
    {
        Some(start) => &raw.frames[start..],
        None => after_trampoline(&raw.frames),
    };
    Ok(ips
        .iter()
        .map(|&ip| parked::Address { ip, lookup: ip })
        .collect())
}

/// The frames after the kernel's signal trampoline, when the interrupted instruction
/// pointer is not known; all of them when the trampoline is not found either.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn after_trampoline(ips: &[usize]) -> &[usize] {
    let lookups: Vec<(usize, usize)> = ips.iter().map(|&ip| (ip, ip)).collect();
    let is_trampoline = |f: &Frame| f.function.as_deref() == Some("__restore_rt");
    let symbols = symbols::resolve(&lookups, &is_trampoline);
    match symbols.frames.last() {
        Some(frames) if frames.iter().any(is_trampoline) => &ips[symbols.frames.len()..],
        _ => ips,
    }
}

#[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
fn capture_impl(
    _tid: u32,
    _deadline: Instant,
    _is_last: &dyn Fn(&Frame) -> bool,
) -> Result<Stack, Error> {
    Err(Error::Unsupported(if cfg!(target_os = "linux") {
        "built without the stack-capture feature"
    } else {
        "only on Linux"
    }))
}

/// What is known of one thread at a hang: its stack where it could be captured, its
/// kernel state where it could be read.
#[derive(Debug)]
pub struct ThreadDiagnostics {
    /// The kernel thread id.
    pub tid: u32,
    /// The native stack, or why there is none.
    pub stack: Result<Stack, Error>,
    /// The kernel's view, or why there is none.
    pub kernel: Result<KernelState, Error>,
}

impl ThreadDiagnostics {
    /// Reads the kernel state of thread `tid` and captures its stack as
    /// [`capture`] does, resolving up to the first frame `is_last` accepts and waiting
    /// at most `timeout` for the stack.
    #[must_use]
    pub fn of(tid: u32, timeout: Duration, is_last: impl Fn(&Frame) -> bool) -> Self {
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

    const TIMEOUT: Duration = Duration::from_secs(5);

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
    fn thread_running(body: impl FnOnce() + Send + 'static) -> (u32, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            tx.send(crate::guard::kernel_tid().unwrap()).unwrap();
            body();
        });
        (rx.recv().unwrap(), handle)
    }

    /// Captures until `found` holds (the thread may not have reached the interesting
    /// frame yet), failing after a generous bound.
    fn capture_eventually(tid: u32, found: impl Fn(&Stack) -> bool) -> Stack {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stack = capture(tid, TIMEOUT).expect("a stack");
            if found(&stack) {
                return stack;
            }
            assert!(Instant::now() < deadline, "never found; last:\n{stack}");
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
        let _serial = signal::SIGNAL_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
