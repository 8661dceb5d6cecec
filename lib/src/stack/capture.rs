//! One capture, step by step: look at the thread, unwind it from the kernel's registers
//! when it is blocked or from the signal's when it runs, check the walk against the
//! guard's poll frame, resolve the frames.

#[cfg(all(feature = "stack-capture", target_os = "linux"))]
use std::time::Duration;
use std::time::Instant;

use super::{Error, Frame, Stack};
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
use super::{MAX_FRAMES, Method, anchor, parked, signal, symbols, unwind};

/// One capture at a time in the process (the signal's atomics are shared), and the
/// unwind tables, kept between captures. Never waited on past a capture's deadline.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(super) static CAPTURE: std::sync::Mutex<unwind::Unwinder> =
    std::sync::Mutex::new(unwind::Unwinder::new());

/// The return addresses of thread `tid`'s stack, innermost first, and how they were
/// found: unwound from outside when it is blocked in the kernel, from the registers a
/// signal recorded when it runs. `before_recheck` runs between the looks at the thread
/// and the last look before the signal (tests move the thread there).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(super) fn unwind_thread(
    tid: u32,
    deadline: Instant,
    before_recheck: &dyn Fn(),
) -> Result<(unwind::Unwound, Method), Error> {
    let mut unwinder = lock_until(deadline)?;
    Ok(match whereabouts(tid, deadline)? {
        parked::Whereabouts::Parked(at) => (
            unwind_parked(&mut unwinder, tid, at, deadline)?,
            Method::Kernel,
        ),
        parked::Whereabouts::Running => {
            match signalled(&mut unwinder, tid, deadline, before_recheck)? {
                Signalled::Unwound(unwound) => (unwound, Method::Signal),
                Signalled::Parked(at) => (
                    unwind_parked(&mut unwinder, tid, at, deadline)?,
                    Method::Kernel,
                ),
            }
        }
    })
}

/// How long resolving a stack's symbols may take past the capture's deadline at most: a
/// debug build's first capture loads its DWARF, which takes up to seconds (longer than
/// the monitor's default capture timeout), and a stack cut for that would be cut for
/// want of time, not of knowledge. Later captures take milliseconds.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const SYMBOLS_BUDGET: Duration = Duration::from_secs(10);

/// Captures thread `tid`'s stack (see [`unwind_thread`]) and resolves its frames.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
pub(super) fn capture_impl(
    tid: u32,
    deadline: Instant,
    is_last: &dyn Fn(&Frame) -> bool,
    before_recheck: &dyn Fn(),
) -> Result<Stack, Error> {
    // Where the guard's poll frame is, read before the unwind: the thread is in that
    // poll while it is stuck, and the walk is checked against it.
    let poll_frame = anchor::of(tid);
    let (mut unwound, method) = unwind_thread(tid, deadline, before_recheck)?;
    let started = Instant::now();
    // Each file's symbols are opened once per stack: the check against the poll frame
    // and the look for a thread's entry read the names resolved here.
    let lookups: Vec<(usize, usize)> = unwound.addresses.iter().map(|a| (a.ip, a.lookup)).collect();
    let mut symbols = symbols::Session::new();
    let symbols_deadline = deadline.max(started + SYMBOLS_BUDGET);
    let mut resolved_frames = symbols.resolve(&lookups, is_last, symbols_deadline);
    for (address, frames) in unwound.addresses.iter().zip(&mut resolved_frames.frames) {
        if address.tail {
            name_the_tail_calling_function_only(frames);
        }
    }
    check_against_the_poll_frame(
        &mut unwound,
        &resolved_frames.frames,
        poll_frame.map(|at| at as u64),
    );
    resolved_frames.frames.truncate(unwound.addresses.len());
    let addresses = &unwound.addresses;
    if let (Some(first), Some(innermost)) = (addresses.first(), resolved_frames.frames.first_mut())
    {
        line_of_the_next_statement(&mut symbols, first.lookup, innermost, symbols_deadline);
    }
    let symbols = resolved_frames;
    let resolved = symbols.frames.len();
    let stopped_early = if symbols.deadline_passed {
        let unresolved = format!(
            "the capture's deadline passed while resolving symbols: {} outer frames are left \
             out",
            addresses.len() - resolved
        );
        Some(match unwound.stopped_early {
            Some(note) => format!("{note}; and {unresolved}"),
            None => unresolved,
        })
    } else {
        unwound.stopped_early
    };
    let frames: Vec<Frame> = symbols.frames.iter().flatten().cloned().collect();
    // What a stack costs the monitor, for docs/performance.md.
    tracing::debug!(
        target: "reconcile_watchdog::stack",
        resolved,
        frames = frames.len(),
        took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "stack symbolized"
    );
    if frames.is_empty() && symbols.deadline_passed {
        return Err(Error::Deadline {
            tid,
            doing: "resolving the stack's symbols",
        });
    }
    if frames.is_empty() {
        return Err(Error::Empty);
    }
    Ok(Stack {
        frames,
        left_out: addresses.len() - resolved,
        method,
        stopped_early,
        poll_frame_unread: poll_frame.is_none(),
        missing_symbols: symbols.missing(resolved),
    })
}

/// The frames at a tail-calling function's jump: only the function (the outermost frame,
/// at the line of the jump or of the inlined call that holds it), without code inlined
/// there, which the jump's bytes alone do not vouch for.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn name_the_tail_calling_function_only(frames: &mut Vec<Frame>) {
    if let Some(function) = frames.pop() {
        frames.clear();
        frames.push(function);
    }
}

/// Whether `frame` is the guard's poll (`Guarded::poll` or code inlined into it).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn is_the_guards_poll(frame: &Frame) -> bool {
    frame
        .file
        .as_deref()
        .is_some_and(|file| file.ends_with("src/guard/guarded.rs"))
        || frame
            .function
            .as_deref()
            .is_some_and(|f| f.starts_with("<reconcile_watchdog::guard::guarded::Guarded<"))
}

/// Checks a walk against the stack address the guard recorded in its poll frame (read
/// before the unwind; `None` when it could not be read): the walk must have gone through
/// that frame, and found the guard's poll there.
///
/// Every frame the walk found is exact (from unwind tables on registers it knew, or a
/// frame record placed exactly by its function's prologue) except those from
/// `unverified_from` on, found through a record that was only the one place a realigned
/// frame allows: those are kept only when the walk reaches the guard's poll, named, at
/// its place. A walk that ended below the poll frame says so, unless it said why already;
/// one that found another function there went astray, and keeps only its exact frames
/// below the frame holding that address (all of them, if all are exact), saying so. Never
/// a stack shown as whole that did not reach the guard's poll.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn check_against_the_poll_frame(
    unwound: &mut unwind::Unwound,
    resolved: &[Vec<Frame>],
    poll_frame: Option<u64>,
) {
    let Some(poll_frame) = poll_frame else {
        if let Some(from) = unwound.unverified_from {
            cut_to(
                unwound,
                from,
                "the guard's poll frame could not be read, so the frame record it was found \
                 through (one of the places its caller's realigned frame allows) cannot be \
                 verified"
                    .to_owned(),
            );
        }
        return;
    };
    let starts: Vec<(usize, u64)> = unwound
        .frame_starts
        .iter()
        .enumerate()
        .filter_map(|(n, start)| start.map(|start| (n, start)))
        .collect();
    // The frame that holds the address: it starts below it, and its caller above it.
    let holder = starts
        .windows(2)
        .find(|pair| pair[0].1 <= poll_frame && poll_frame < pair[1].1)
        .map(|pair| (pair[0].0, pair[1].0));
    let Some((from, to)) = holder else {
        if let Some(unverified) = unwound.unverified_from {
            cut_to(
                unwound,
                unverified,
                format!(
                    "the walk through the frame record found in its caller's realigned frame \
                     did not reach the guard's poll frame (at {poll_frame:#x} on the stack), so \
                     it cannot be verified"
                ),
            );
        } else if unwound.stopped_early.is_none()
            && let Some(last) = unwound.addresses.last()
        {
            unwound.stopped_early = Some(format!(
                "frames above {:#x} could not be unwound: the unwind ended before the guard's poll frame (at {poll_frame:#x} on the stack)",
                last.ip
            ));
        }
        return;
    };
    // Resolving stopped below the holder when a frame below it was the last wanted: the
    // frames shown all lie below it then, and its place is what is checked.
    let frames: Vec<&Frame> = resolved
        .get(from..to.min(resolved.len()))
        .unwrap_or_default()
        .iter()
        .flatten()
        .collect();
    // Without symbols the frame cannot be told by name: its place is what is checked,
    // which is enough for exact frames only.
    let named = frames.iter().any(|f| f.function.is_some());
    let is_the_poll = frames.iter().any(|f| is_the_guards_poll(f));
    if is_the_poll || (!named && unwound.unverified_from.is_none()) {
        // A record found in a realigned frame above the poll's is not verified by it.
        if let Some(unverified) = unwound.unverified_from.filter(|&at| at > from) {
            cut_to(
                unwound,
                unverified,
                "the frame record found in its caller's realigned frame lies above the \
                 guard's poll frame, which cannot verify it"
                    .to_owned(),
            );
        }
        return;
    }
    let keep = unwound
        .unverified_from
        .unwrap_or(from)
        .clamp(1, from.max(1));
    let below = unwound.addresses[keep - 1].ip;
    cut_to(
        unwound,
        keep,
        format!(
            "frames above {below:#x} could not be unwound: the unwind did not go through the \
             guard's poll frame (at {poll_frame:#x} on the stack){}, so the frames it found above \
             cannot be vouched for",
            if named {
                ""
            } else {
                " by name, for want of symbols"
            }
        ),
    );
}

/// Keeps the first `keep` frames of `unwound`, with `why` as its note.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn cut_to(unwound: &mut unwind::Unwound, keep: usize, why: String) {
    let keep = keep.min(unwound.addresses.len());
    let why = match unwound.addresses.get(keep.wrapping_sub(1)) {
        Some(below) if !why.starts_with("frames above") => {
            format!("frames above {:#x} could not be unwound: {why}", below.ip)
        }
        _ => why,
    };
    unwound.addresses.truncate(keep);
    unwound.frame_starts.truncate(keep);
    unwound.unverified_from = None;
    unwound.stopped_early = Some(why);
}

/// How far past an interrupted instruction without a line to look for one.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const NEXT_LINE_SEARCH: usize = 16;

/// The line table gives some instructions no line (line 0: glue the compiler could not
/// give one statement, such as a loop's head), and a thread can be stopped at one: the
/// innermost function's frame (the last of `frames`) then gets the line of the next
/// instruction of the same function that has one, the statement it was about to run.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn line_of_the_next_statement(
    symbols: &mut symbols::Session,
    pc: usize,
    frames: &mut [Frame],
    deadline: Instant,
) {
    let Some(innermost) = frames.last_mut() else {
        return;
    };
    if innermost.line.is_some() || innermost.file.is_none() {
        return;
    }
    let lookups: Vec<(usize, usize)> = (1..=NEXT_LINE_SEARCH)
        .map(|offset| (pc, pc.saturating_add(offset)))
        .collect();
    let next = symbols.resolve(&lookups, &|_| false, deadline);
    if let Some(found) = next
        .frames
        .iter()
        .filter_map(|frames| frames.last())
        .find(|found| {
            found.function == innermost.function
                && found.file == innermost.file
                && found.line.is_some()
        })
    {
        innermost.line = found.line;
    }
}

/// The capture lock, waited for until `deadline` at most. A capture that panicked
/// holding it leaves tables that may be half built: they are dropped.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn lock_until(
    deadline: Instant,
) -> Result<std::sync::MutexGuard<'static, unwind::Unwinder>, Error> {
    loop {
        match CAPTURE.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                let mut guard = poisoned.into_inner();
                *guard = unwind::Unwinder::new();
                CAPTURE.clear_poison();
                return Ok(guard);
            }
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => {
                return Err(Error::Busy);
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// How many times, a millisecond apart, a thread must be seen running before it is
/// signalled: a thread that is mostly blocked (a loop of short reads or sleeps) is
/// then caught blocked and unwound from outside, not signalled as it enters a call.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
const RUNNING_LOOKS: usize = 5;

/// Where thread `tid` is: blocked, or running at each of [`RUNNING_LOOKS`] looks and
/// never blocked in between (its count of voluntary context switches unchanged). A
/// thread that blocked between the looks is not a busy loop: it is looked at until it
/// is caught blocked, and unwound from outside, or the deadline passes; it is not
/// signalled (the signal could find it entering a system call).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn whereabouts(tid: u32, deadline: Instant) -> Result<parked::Whereabouts, Error> {
    let switches = voluntary_switches(tid);
    let found = looks(tid, deadline)?;
    if found != parked::Whereabouts::Running || switches.is_none() {
        return Ok(found);
    }
    if voluntary_switches(tid) == switches {
        return Ok(found);
    }
    loop {
        if let found @ parked::Whereabouts::Parked(_) = look_at(tid)? {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(Error::KeptMoving { tid });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How many times thread `tid` has blocked (`voluntary_ctxt_switches` in its status).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn voluntary_switches(tid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|count| count.trim().parse().ok())
}

/// Blocked at one of [`RUNNING_LOOKS`] looks a millisecond apart, or running at each.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn looks(tid: u32, deadline: Instant) -> Result<parked::Whereabouts, Error> {
    for look in 1..=RUNNING_LOOKS {
        match look_at(tid)? {
            parked::Whereabouts::Running if look < RUNNING_LOOKS => {
                if Instant::now() >= deadline {
                    return Err(Error::Deadline {
                        tid,
                        doing: "watching whether the thread keeps running",
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            found => return Ok(found),
        }
    }
    Ok(parked::Whereabouts::Running)
}

/// One look at where thread `tid` is.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn look_at(tid: u32) -> Result<parked::Whereabouts, Error> {
    parked::whereabouts(tid).map_err(|source| whereabouts_error(tid, source))
}

/// A `syscall` file that is missing is only "no such thread" when the thread's
/// directory is missing too (a kernel without that file has the directory) and this
/// process's is there (without `/proc`, nothing is known of the thread).
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn whereabouts_error(tid: u32, source: std::io::Error) -> Error {
    if source.kind() == std::io::ErrorKind::NotFound
        && std::path::Path::new("/proc/self/task").exists()
        && !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
    {
        return Error::NoSuchThread { tid, source };
    }
    Error::Whereabouts { tid, source }
}

/// The error of a failed unwind of thread `tid`; `parked` when it was blocked.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn unwind_error(tid: u32, failure: unwind::Failure, parked: bool) -> Error {
    match failure {
        unwind::Failure::KeptMoving | unwind::Failure::Running => Error::KeptMoving { tid },
        unwind::Failure::Whereabouts(source) => whereabouts_error(tid, source),
        unwind::Failure::Maps(source) => Error::Maps(source),
        unwind::Failure::Stack(source) => Error::StackRead { tid, source },
        unwind::Failure::Deadline(doing) => Error::Deadline { tid, doing },
        unwind::Failure::Unsupported if parked => Error::BlockedUnwindUnsupported { tid },
        unwind::Failure::Unsupported => {
            Error::Unsupported("unwinding is implemented for x86_64 and aarch64 only")
        }
    }
}

/// The frames of a thread blocked in the kernel, unwound from outside.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn unwind_parked(
    unwinder: &mut unwind::Unwinder,
    tid: u32,
    at: parked::Parked,
    deadline: Instant,
) -> Result<unwind::Unwound, Error> {
    parked::unwind_parked(unwinder, tid, at, MAX_FRAMES, deadline)
        .map_err(|failure| unwind_error(tid, failure, true))
}

/// What the signal path found.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
enum Signalled {
    /// The stack of the running thread.
    Unwound(unwind::Unwound),
    /// The thread was blocked at the last look before the signal, which was not sent.
    Parked(parked::Parked),
}

/// The stack of a running thread: stopped by the signal while its stack is copied,
/// unwound here from the registers it was interrupted at.
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn signalled(
    unwinder: &mut unwind::Unwinder,
    tid: u32,
    deadline: Instant,
    before_recheck: &dyn Fn(),
) -> Result<Signalled, Error> {
    // Everything that can be done before the signal is, so that the thread is held
    // only for the copy of its stack.
    let maps = unwind::Maps::read().map_err(Error::Maps)?;
    unwinder
        .update(&maps, deadline)
        .map_err(|failure| unwind_error(tid, failure, false))?;
    let prepared =
        unwind::PreparedCopy::new().map_err(|source| Error::StackRead { tid, source })?;
    let armed = signal::arm(tid)?;
    before_recheck();
    // The last look, immediately before the signal: a thread that entered a system
    // call since the looks above is not signalled (the signal would interrupt it).
    if let parked::Whereabouts::Parked(at) = look_at(tid)? {
        return Ok(Signalled::Parked(at));
    }
    armed.send()?;
    let registers = armed.wait_for_registers(deadline)?;
    let copying = Instant::now();
    let copy = prepared.copy(&maps, registers.sp);
    let still_held = armed.release();
    // How long a capture stops a running thread, for docs/performance.md.
    tracing::debug!(
        target: "reconcile_watchdog::stack",
        tid,
        held_us = u64::try_from(copying.elapsed().as_micros()).unwrap_or(u64::MAX),
        "running thread let go after its stack was copied"
    );
    if !still_held {
        return Err(Error::LeftHandler {
            tid,
            held: signal::MAX_HOLD,
        });
    }
    let copy = copy.map_err(|source| Error::StackRead { tid, source })?;
    unwinder
        .unwind(&maps, &registers, &copy, MAX_FRAMES, deadline)
        .map(Signalled::Unwound)
        .map_err(|failure| unwind_error(tid, failure, false))
}

#[cfg(not(all(feature = "stack-capture", target_os = "linux")))]
pub(super) fn capture_impl(
    _tid: u32,
    _deadline: Instant,
    _is_last: &dyn Fn(&Frame) -> bool,
    _before_recheck: &dyn Fn(),
) -> Result<Stack, Error> {
    Err(Error::Unsupported(if cfg!(target_os = "linux") {
        "built without the stack-capture feature"
    } else {
        "only on Linux"
    }))
}
