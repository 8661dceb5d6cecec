//! A guarded reconcile that blocks in a function of its own, one way per run, and the
//! stack the library captures of the blocked worker, printed one frame a line
//! (`frame<TAB>function<TAB>file<TAB>line`, then `stopped_early<TAB>why` if it did):
//! `stack-fixtures CASE`, where CASE is one of [`CASES`]. It first prints
//! `frame_pointers<TAB>yes` or `no`: whether its own functions were built keeping them
//! (x86_64: whether a blocking function's code starts with `push %rbp; mov %rsp,%rbp`),
//! and last `chain<TAB>...`: the fixture's own functions the blocked thread is in,
//! outermost first, as each recorded itself on its way in (`adversarial.rs`).

mod adversarial;

use std::hint::black_box;
use std::io::Read;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{ObjectKey, Registry};

/// The kernel's id of the worker thread that blocks, once it is about to.
static BLOCKED_TID: AtomicU32 = AtomicU32::new(0);

/// What the blocking functions block on, held or left unsignalled by `main`.
static HELD: Mutex<()> = Mutex::new(());
static NEVER: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Long enough to outlast any capture: the process exits under the blocked thread.
const FOREVER: Duration = Duration::from_secs(3600);

fn kernel_tid() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .expect("a tid")
}

fn about_to_block() {
    BLOCKED_TID.store(kernel_tid(), Ordering::Release);
}

#[inline(never)]
fn blocking_in_sleep() {
    about_to_block();
    std::thread::sleep(FOREVER);
}

#[inline(never)]
fn blocking_in_mutex() {
    about_to_block();
    drop(HELD.lock());
}

#[inline(never)]
fn blocking_in_condvar() {
    about_to_block();
    let (lock, signal) = &NEVER;
    let mut done = lock.lock().unwrap();
    while !*done {
        done = signal.wait(done).unwrap();
    }
}

#[inline(never)]
fn blocking_in_socket_read(mut stream: std::net::TcpStream) {
    about_to_block();
    let _ = stream.read(&mut [0; 64]);
}

#[inline(never)]
fn blocking_in_pipe_read(mut reader: std::io::PipeReader) {
    about_to_block();
    let _ = reader.read(&mut [0; 64]);
}

#[inline(never)]
fn blocking_in_command_output(stdin: std::io::PipeReader) {
    about_to_block();
    // The child waits for a line on a pipe `main` holds open: it ends with this process.
    let _ = std::process::Command::new("sh")
        .args(["-c", "read line"])
        .stdin(stdin)
        .output();
}

/// Calls a few levels deep and returns: the frame records it leaves below the caller's
/// stack pointer are stale once it has.
#[inline(never)]
fn deep(levels: u32) -> Duration {
    if levels == 0 {
        let start = Instant::now();
        return black_box(start).elapsed();
    }
    deep(black_box(levels - 1)) + black_box(Duration::from_nanos(u64::from(levels)))
}

/// Blocks from a frame with room the compiler never writes: what the calls of `deep`
/// left there is still on the stack.
#[inline(never)]
fn blocking_in_a_frame_never_written() {
    let mut room = MaybeUninit::<[u64; 512]>::uninit();
    black_box(&mut room);
    about_to_block();
    std::thread::sleep(FOREVER);
}

#[inline(never)]
fn blocking_after_deep_calls() {
    black_box(deep(black_box(4)));
    blocking_in_a_frame_never_written();
}

/// Held by `main` for the process's life: what the blocking reads wait on.
struct Ends {
    _peer: Option<std::net::TcpStream>,
    _writer: Option<std::io::PipeWriter>,
}

/// The reconcile: a timer, as an operator's first await, then the blocking call.
async fn reconcile(case: String, ends: std::sync::mpsc::Sender<Ends>) -> Result<(), ()> {
    adversarial::chain("reconcile");
    tokio::time::sleep(Duration::from_millis(10)).await;
    match case.as_str() {
        "sleep" => blocking_in_sleep(),
        "mutex" => blocking_in_mutex(),
        "condvar" => blocking_in_condvar(),
        "socket" => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (stream, _) = listener.accept().unwrap();
            ends.send(Ends {
                _peer: Some(peer),
                _writer: None,
            })
            .unwrap();
            blocking_in_socket_read(stream);
        }
        "pipe" | "command" => {
            let (reader, writer) = std::io::pipe().unwrap();
            ends.send(Ends {
                _peer: None,
                _writer: Some(writer),
            })
            .unwrap();
            if case == "pipe" {
                blocking_in_pipe_read(reader);
            } else {
                blocking_in_command_output(reader);
            }
        }
        "stale" => blocking_after_deep_calls(),
        other => adversarial::run(other),
    }
    Ok(())
}

/// Whether the function at `code` starts by saving and setting the frame pointer.
fn keeps_frame_pointers(code: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let mut bytes = [0; 8];
    let memory = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
    memory
        .read_exact_at(&mut bytes, code as u64)
        .expect("its own code");
    let bytes = bytes
        .strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa])
        .unwrap_or(&bytes);
    bytes.starts_with(&[0x55, 0x48, 0x89, 0xe5])
}

fn main() {
    let case = std::env::args().nth(1).expect("a case");
    let keeps = keeps_frame_pointers(blocking_in_mutex as fn() as usize);
    println!("frame_pointers\t{}", if keeps { "yes" } else { "no" });
    let _held = HELD.lock().unwrap();
    let _fifo = adversarial::prepare(&case);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let registry = Registry::new(Duration::from_secs(60));
    let handle = registry.controller("fixture", "Fixture");
    let (ends, received) = std::sync::mpsc::channel();
    runtime.spawn(handle.guard(ObjectKey::cluster("blocked"), reconcile(case, ends)));
    let _ends = received.recv_timeout(Duration::from_secs(1)).ok();
    let deadline = Instant::now() + Duration::from_secs(30);
    let tid = loop {
        let tid = BLOCKED_TID.load(Ordering::Acquire);
        if tid != 0 && !still_running(tid) {
            break tid;
        }
        assert!(Instant::now() < deadline, "the worker did not block");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Settled in its blocking call (a child started, a lock's spin given up).
    std::thread::sleep(Duration::from_millis(200));
    match reconcile_watchdog::stack::capture(tid, Duration::from_secs(10)) {
        Ok(stack) => {
            for frame in &stack.frames {
                println!(
                    "frame\t{}\t{}\t{}",
                    frame.function.as_deref().unwrap_or("?"),
                    frame.file.as_deref().unwrap_or("?"),
                    frame.line.map_or_else(|| "?".to_owned(), |l| l.to_string())
                );
            }
            if let Some(why) = &stack.stopped_early {
                println!("stopped_early\t{why}");
            }
        }
        Err(error) => println!("error\t{error}"),
    }
    println!("chain\t{}", adversarial::recorded().join("\t"));
    // The blocked worker is not waited for.
    std::process::exit(0);
}

/// Whether thread `tid` is running in user space (not yet blocked).
fn still_running(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
        .map_or(true, |line| line.trim() == "running")
}
