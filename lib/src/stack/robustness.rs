//! Captures of threads in the states that break capture done inside a signal handler:
//! a garbage stack, a full stack, an unwinder busy on the thread, a thread entering a
//! blocking call between the looks and the signal.
#![allow(unsafe_code)] // inline assembly and pthread_getattr_np, in tests only

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::capture::{capture_impl, unwind_thread};
use super::tests::{TIMEOUT, capture_eventually, thread_running};
use super::{Error, Method, capture, capture_until, parked};

/// Spins with a garbage frame pointer, and garbage where its return address would be,
/// until `stop`.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn spinning_on_a_garbage_frame(stop: &AtomicBool) {
    // SAFETY: saves the frame pointer on the stack, then puts garbage in it and in two
    // more words pushed below; spins reading the flag, a valid byte for the whole
    // loop; then pops exactly what it pushed, so rsp and rbp are as they were.
    unsafe {
        std::arch::asm!(
            "push rbp",
            "mov rbp, {garbage}",
            "push {garbage}",
            "push {garbage}",
            "2:",
            "pause",
            "cmp byte ptr [{stop}], 0",
            "je 2b",
            "add rsp, 16",
            "pop rbp",
            stop = in(reg) stop.as_ptr(),
            garbage = in(reg) 0x0bad_f00d_dead_beef_u64,
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_thread_spinning_on_a_garbage_frame_gives_what_could_be_unwound_and_why() {
    let stop = Arc::new(AtomicBool::new(false));
    let (tid, handle) = {
        let stop = Arc::clone(&stop);
        thread_running(move || spinning_on_a_garbage_frame(&stop))
    };
    let stack = capture_eventually(tid, |s| s.mentions("spinning_on_a_garbage_frame"));
    assert_eq!(stack.method, Method::Signal, "{stack}");
    // The innermost frame is the loop; what the garbage leads to is not followed.
    assert!(
        stack.frames[0]
            .function
            .as_deref()
            .is_some_and(|f| f.contains("spinning_on_a_garbage_frame")),
        "{stack}"
    );
    let reason = stack.stopped_early.as_deref().expect("a reason");
    assert!(reason.contains("the unwind stopped"), "{reason}");
    assert!(stack.to_string().contains(reason), "{stack}");
    // Several more, to be sure: the process lives on.
    for _ in 0..20 {
        let _ = capture(tid, TIMEOUT);
    }
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
}

/// The lowest usable address of the calling thread's stack (above its guard page).
fn stack_bottom() -> usize {
    // SAFETY: `attr` is initialised by pthread_getattr_np for the calling thread,
    // read by pthread_attr_getstack into two valid out-pointers, and destroyed once.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        addr as usize
    }
}

/// Recurses until fewer than `margin` bytes of stack are left below its frame, then
/// spins there until `stop`, having stored how many bytes were left.
#[inline(never)]
fn deeper_until(bottom: usize, margin: usize, left: &AtomicUsize, stop: &AtomicBool) {
    let pad = [0_u8; 128];
    let here = std::hint::black_box(&pad).as_ptr() as usize;
    if here - bottom > margin {
        deeper_until(bottom, margin, left, stop);
    } else {
        left.store(here - bottom, Ordering::Release);
        spinning_at_the_end_of_its_stack(stop);
    }
    std::hint::black_box(&pad);
}

#[inline(never)]
fn spinning_at_the_end_of_its_stack(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

#[test]
fn a_thread_spinning_at_the_end_of_a_small_stack_is_captured_without_overflow() {
    let stop = Arc::new(AtomicBool::new(false));
    let left = Arc::new(AtomicUsize::new(0));
    let tid = Arc::new(AtomicU32::new(0));
    let handle = {
        let (stop, left, tid) = (Arc::clone(&stop), Arc::clone(&left), Arc::clone(&tid));
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ready = crate::stack::alt_stack::prepare();
                tid.store(crate::guard::kernel_tid().unwrap(), Ordering::Release);
                // Less than the kernel's signal frame with the AVX-512 state (about
                // 2.5 KiB): without the alternate stack, the signal would overflow it.
                deeper_until(stack_bottom(), 768, &left, &stop);
            })
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while left.load(Ordering::Acquire) == 0 {
        assert!(
            Instant::now() < deadline,
            "never reached the end of its stack"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let stack = capture_eventually(tid.load(Ordering::Acquire), |s| {
        s.mentions("spinning_at_the_end_of_its_stack")
    });
    assert_eq!(stack.method, Method::Signal, "{stack}");
    assert!(stack.mentions("deeper_until"), "{stack}");
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
}

#[inline(never)]
fn spinning(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

#[test]
fn captures_while_another_thread_unwinds_itself_neither_deadlock_nor_crash() {
    let stop = Arc::new(AtomicBool::new(false));
    let traces = Arc::new(AtomicUsize::new(0));
    let (spinner, spinning_thread) = {
        let stop = Arc::clone(&stop);
        thread_running(move || spinning(&stop))
    };
    let (tracer, tracing_thread) = {
        let (stop, traces) = (Arc::clone(&stop), Arc::clone(&traces));
        thread_running(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut frames = 0;
                backtrace::trace(|_| {
                    frames += 1;
                    true
                });
                assert!(frames > 0);
                traces.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Resolving stops at the first frame of this module: symbols are not the point.
    let first_frame_only = |f: &super::Frame| {
        f.function
            .as_deref()
            .is_some_and(|name| name.contains("robustness"))
    };
    // Resolving a stack of a debug test binary reads its DWARF afresh (about 0.4 s):
    // the first and last captures of each thread are resolved, the others only unwound
    // (signal, stack copy, unwind: what could deadlock or crash).
    let unwound = |tid: u32| {
        unwind_thread(tid, Instant::now() + TIMEOUT, &|| {})
            .map(|(unwound, _)| assert!(!unwound.addresses.is_empty()))
    };
    let (mut spinner_stacks, mut tracer_stacks, mut let_go) = (0, 0, 0);
    for round in 0..200 {
        let resolve = round == 0 || round == 199;
        let spinner_capture = if resolve {
            capture_until(spinner, TIMEOUT, first_frame_only)
                .map(|stack| assert!(stack.mentions("spinning"), "{stack}"))
        } else {
            unwound(spinner)
        };
        match spinner_capture {
            Ok(()) => spinner_stacks += 1,
            Err(Error::LeftHandler { .. }) => let_go += 1,
            Err(err) => panic!("{err}"),
        }
        // The thread inside the unwinder (and its lock) when the signal lands: the
        // handler takes no lock, so both carry on.
        let before = traces.load(Ordering::Relaxed);
        let tracer_capture = if resolve {
            capture_until(tracer, TIMEOUT, first_frame_only).map(drop)
        } else {
            unwound(tracer)
        };
        match tracer_capture {
            Ok(()) => tracer_stacks += 1,
            Err(Error::LeftHandler { .. } | Error::KeptMoving { .. }) => let_go += 1,
            Err(err) => panic!("{err}"),
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while traces.load(Ordering::Relaxed) == before {
            assert!(Instant::now() < deadline, "the tracing thread is stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // Nearly every capture got a stack; a few may be let go on a loaded machine.
    assert!(
        spinner_stacks >= 150 && tracer_stacks >= 150,
        "{spinner_stacks} and {tracer_stacks} stacks, {let_go} let go"
    );
    stop.store(true, Ordering::Relaxed);
    spinning_thread.join().unwrap();
    tracing_thread.join().unwrap();
}

#[inline(never)]
fn in_poll_with_a_timeout() -> bool {
    // SAFETY: no descriptors (a null array of length 0): poll only waits.
    let n = unsafe { libc::poll(std::ptr::null_mut(), 0, 300) };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
}

#[test]
fn a_thread_that_enters_poll_after_the_looks_is_seen_blocked_at_the_last_look_and_not_signalled() {
    let spinning_now = Arc::new(AtomicBool::new(false));
    let go_poll = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicUsize::new(0));
    let (tid, handle) = {
        let (spinning_now, go_poll, stop, interrupted) = (
            Arc::clone(&spinning_now),
            Arc::clone(&go_poll),
            Arc::clone(&stop),
            Arc::clone(&interrupted),
        );
        thread_running(move || {
            spinning_now.store(true, Ordering::Release);
            spinning(&go_poll);
            while !stop.load(Ordering::Relaxed) {
                if in_poll_with_a_timeout() {
                    interrupted.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    while !spinning_now.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Between the looks (which see it running) and the last look before the signal,
    // the thread goes into `poll`.
    let moved_to_poll = || {
        go_poll.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while parked::whereabouts(tid).unwrap() == parked::Whereabouts::Running {
            assert!(Instant::now() < deadline, "never entered poll");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let stack = capture_impl(tid, Instant::now() + TIMEOUT, &|_| false, &moved_to_poll)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        stack.method,
        Method::Kernel,
        "unwound from outside, not signalled:\n{stack}"
    );
    assert!(stack.mentions("in_poll_with_a_timeout"), "{stack}");
    // A signal would have cut the poll short; let it run out at least once.
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
    assert_eq!(
        interrupted.load(Ordering::Relaxed),
        0,
        "poll was interrupted"
    );
}
