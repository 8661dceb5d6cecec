//! Blocking shapes that a stack walk without frame pointers can get wrong: indirect calls
//! of a function that an earlier, finished chain of direct calls also reached (its frame
//! records are still on the stack), over-aligned locals and frames over 4 KiB (stack
//! probes) in the blocking function and in its callers, tail calls after an inlined
//! helper, and blocking under a lazy static, `block_in_place`, `futures`' `block_on`,
//! direct C calls and FIFOs.
//!
//! Each function on the way to the blocking call records its name with [`chain`] before
//! it calls on (never on the earlier, finished chains), so the fixture can print the
//! real chain beside the captured one.

use std::hint::black_box;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The fixture's functions the blocking thread went through, outermost first.
static CHAIN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Records `function` (as named after `stack_fixtures::`) as on the blocking chain, and
/// the thread as the one `main` waits to block.
#[inline(never)]
pub fn chain(function: &'static str) {
    CHAIN.lock().unwrap().push(function);
    // The reconcile awaits a timer after it records itself: not blocked yet.
    if function != "reconcile" {
        super::about_to_block();
    }
}

/// The chain recorded so far.
pub fn recorded() -> Vec<&'static str> {
    CHAIN.lock().unwrap().clone()
}

/// Written after a call so that the call is not the caller's last act (no tail call).
static AFTER: AtomicU64 = AtomicU64::new(0);

#[inline(always)]
fn after_the_call() {
    AFTER.fetch_add(1, Ordering::Relaxed);
}

/// What an inlined helper at a tail-calling function's first instruction counts.
static HITS: AtomicU64 = AtomicU64::new(0);

/// Where the FIFO cases' FIFO is, made by [`prepare`].
static FIFO: OnceLock<std::path::PathBuf> = OnceLock::new();

/// A FIFO for the FIFO cases, and for `fifo_read` a writer held open (so that a read
/// blocks instead of seeing the end): removed when dropped.
pub struct Fifo {
    path: std::path::PathBuf,
    _writer: Option<std::fs::File>,
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes what `case` blocks on that `main` must hold.
pub fn prepare(case: &str) -> Option<Fifo> {
    use std::os::unix::ffi::OsStrExt;
    if !case.starts_with("fifo") {
        return None;
    }
    let path = std::env::temp_dir().join(format!("stack-fixtures-{}.fifo", std::process::id()));
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    // Opening for reading and writing does not wait for a reader.
    let writer = (case == "fifo_read").then(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap()
    });
    FIFO.set(path.clone()).unwrap();
    Some(Fifo {
        path,
        _writer: writer,
    })
}

/// Runs adversarial case `case` on the reconcile's thread: it never returns.
pub fn run(case: &str) {
    chain("adversarial::run");
    match case {
        "fn_pointer" => via_fn_pointer(),
        "dyn_trait" => via_dyn_trait(),
        "aligned_leaf" => via_direct_calls(),
        "aligned_caller" => aligned_caller(),
        "big_leaf" => via_big_leaf(),
        "big_caller" => big_caller(),
        "huge_leaf" => via_huge_leaf(),
        "tail_call" => via_tail_call(),
        "tail_call_libc" => via_tail_call_libc(),
        "once_lock" => via_once_lock(),
        "block_in_place" => via_block_in_place(),
        "block_on" => via_block_on(),
        "libc_read" => via_libc_read(),
        "libc_nanosleep" => via_libc_nanosleep(),
        "fifo_open" => opening_a_fifo(),
        "fifo_read" => reading_a_fifo(),
        other => panic!("no case {other}"),
    }
    after_the_call();
}

/// A local the compiler must place at a 64-byte boundary: the function realigns its
/// stack pointer, and so keeps a frame pointer in any build.
#[repr(align(64))]
struct Aligned([u8; 64]);

/// Sleeps in the C library directly: no frame of the standard library (built with
/// frame pointers) between the caller and the C library's, which has none.
#[inline(always)]
fn sleep_in_libc() -> ! {
    chain("adversarial::sleep_in_libc");
    let forever = libc::timespec {
        tv_sec: 3600,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: valid pointers; a null remainder is allowed.
        unsafe { libc::nanosleep(&forever, std::ptr::null_mut()) };
    }
}

/// Blocks when `block`, else returns at once. Its frame has over-aligned locals and
/// room it never writes, where the records of an earlier call of it stay.
#[inline(never)]
fn aligned_sleeper(block: bool) -> u8 {
    let mut local = Aligned([0; 64]);
    black_box(&mut local);
    let mut room = MaybeUninit::<[u64; 256]>::uninit();
    black_box(&mut room);
    if block {
        chain("adversarial::aligned_sleeper");
        sleep_in_libc();
    }
    local.0[1]
}

/// The same, as a trait method called through `dyn`.
trait Block {
    fn block(&self, block: bool) -> u8;
}

struct AlignedSleeper;

impl Block for AlignedSleeper {
    #[inline(never)]
    fn block(&self, block: bool) -> u8 {
        let mut local = Aligned([0; 64]);
        black_box(&mut local);
        let mut room = MaybeUninit::<[u64; 256]>::uninit();
        black_box(&mut room);
        if block {
            chain(
                "<stack_fixtures::adversarial::AlignedSleeper as stack_fixtures::adversarial::Block>::block",
            );
            sleep_in_libc();
        }
        local.0[1]
    }
}

/// A chain of direct calls that reaches `reach` and returns: it leaves frame records of
/// `reach` and of itself below its caller's stack pointer.
#[inline(never)]
fn earlier_call_1(reach: fn()) {
    black_box(&mut [0u64; 4]);
    earlier_call_2(reach);
    after_the_call();
}

#[inline(never)]
fn earlier_call_2(reach: fn()) {
    black_box(&mut [0u64; 4]);
    earlier_call_3(reach);
    after_the_call();
}

#[inline(never)]
fn earlier_call_3(reach: fn()) {
    black_box(&mut [0u64; 4]);
    earlier_call_4(reach);
    after_the_call();
}

#[inline(never)]
fn earlier_call_4(reach: fn()) {
    black_box(&mut [0u64; 4]);
    reach();
    after_the_call();
}

/// What the earlier chains end in: direct calls of the function that blocks later.
#[inline(never)]
fn reach_aligned_sleeper() {
    black_box(aligned_sleeper(black_box(false)));
}

#[inline(never)]
fn reach_aligned_sleeper_method() {
    black_box(AlignedSleeper.block(black_box(false)));
}

#[inline(never)]
fn via_fn_pointer() {
    chain("adversarial::via_fn_pointer");
    earlier_call_1(reach_aligned_sleeper);
    let sleeper = black_box(aligned_sleeper as fn(bool) -> u8);
    black_box(sleeper(true));
    after_the_call();
}

#[inline(never)]
fn via_dyn_trait() {
    chain("adversarial::via_dyn_trait");
    earlier_call_1(reach_aligned_sleeper_method);
    let sleeper: &dyn Block = black_box(&AlignedSleeper);
    black_box(sleeper.block(true));
    after_the_call();
}

#[inline(never)]
fn via_direct_calls() {
    chain("adversarial::via_direct_calls");
    earlier_call_1(reach_aligned_sleeper);
    black_box(aligned_sleeper(black_box(true)));
    after_the_call();
}

/// Sleeps through the standard library.
#[inline(never)]
fn plain_sleeper() {
    chain("adversarial::plain_sleeper");
    std::thread::sleep(super::FOREVER);
    after_the_call();
}

/// A caller with over-aligned locals.
#[inline(never)]
fn aligned_caller() {
    chain("adversarial::aligned_caller");
    let mut local = Aligned([0; 64]);
    black_box(&mut local);
    plain_sleeper();
    black_box(&mut local);
}

/// A frame of 8 KiB: its prologue probes the stack a page at a time.
#[inline(never)]
fn big_sleeper() {
    let mut big = [0u8; 8192];
    black_box(&mut big);
    chain("adversarial::big_sleeper");
    sleep_in_libc();
}

#[inline(never)]
fn via_big_leaf() {
    chain("adversarial::via_big_leaf");
    earlier_call_1(reach_big_sleeper_and_back);
    big_sleeper();
}

/// Returns at once, from a frame of 8 KiB: a record of it stays below its caller.
#[inline(never)]
fn reach_big_sleeper_and_back() {
    let mut big = [0u8; 8192];
    black_box(&mut big);
}

/// A frame of 256 KiB: its prologue probes the stack in a loop, which the unwinder's
/// prologue parser does not follow, and it sleeps in the C library directly, so its
/// caller is found through its frame pointer, wherever it keeps one: a stack to cut.
#[inline(never)]
fn huge_sleeper() {
    let mut huge = [0u8; 256 * 1024];
    black_box(&mut huge);
    chain("adversarial::huge_sleeper");
    sleep_in_libc();
}

#[inline(never)]
fn via_huge_leaf() {
    chain("adversarial::via_huge_leaf");
    huge_sleeper();
    after_the_call();
}

/// A caller of 8 KiB.
#[inline(never)]
fn big_caller() {
    chain("adversarial::big_caller");
    let mut big = [0u8; 8192];
    black_box(&mut big);
    plain_sleeper();
    black_box(&mut big);
}

/// Sleeps in the C library directly from a frame of its own.
#[inline(never)]
fn libc_sleeper() {
    chain("adversarial::libc_sleeper");
    sleep_in_libc();
}

/// Counts (an atomic add inlined at its first instruction), then jumps to the sleeper:
/// its last act is the call, so it leaves no frame of its own.
#[inline(never)]
fn tail_caller() {
    HITS.fetch_add(1, Ordering::Relaxed);
    chain("adversarial::tail_caller");
    plain_sleeper();
}

#[inline(never)]
fn tail_caller_libc() {
    HITS.fetch_add(1, Ordering::Relaxed);
    chain("adversarial::tail_caller_libc");
    libc_sleeper();
}

#[inline(never)]
fn via_tail_call() {
    chain("adversarial::via_tail_call");
    tail_caller();
    after_the_call();
}

#[inline(never)]
fn via_tail_call_libc() {
    chain("adversarial::via_tail_call_libc");
    tail_caller_libc();
    after_the_call();
}

static LAZY: OnceLock<u64> = OnceLock::new();

#[inline(never)]
fn via_once_lock() {
    chain("adversarial::via_once_lock");
    black_box(LAZY.get_or_init(|| {
        plain_sleeper();
        1
    }));
    after_the_call();
}

#[inline(never)]
fn via_block_in_place() {
    chain("adversarial::via_block_in_place");
    tokio::task::block_in_place(plain_sleeper);
    after_the_call();
}

#[inline(never)]
fn via_block_on() {
    chain("adversarial::via_block_on");
    futures::executor::block_on(async { plain_sleeper() });
    after_the_call();
}

#[inline(never)]
fn via_libc_read() {
    chain("adversarial::via_libc_read");
    let mut fds = [0; 2];
    // SAFETY: room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let mut buffer = [0u8; 64];
    // The write end stays open (never closed): the read waits for ever.
    // SAFETY: a valid descriptor and buffer.
    black_box(unsafe { libc::read(fds[0], buffer.as_mut_ptr().cast(), buffer.len()) });
    after_the_call();
}

#[inline(never)]
fn via_libc_nanosleep() {
    chain("adversarial::via_libc_nanosleep");
    libc_sleeper();
    after_the_call();
}

/// Opens the FIFO for reading: the open waits for a writer, which never comes.
#[inline(never)]
fn opening_a_fifo() {
    chain("adversarial::opening_a_fifo");
    black_box(std::fs::File::open(FIFO.get().unwrap()).map(drop).ok());
    after_the_call();
}

/// Reads the FIFO, whose writer `main` holds open and never writes.
#[inline(never)]
fn reading_a_fifo() {
    use std::io::Read;
    chain("adversarial::reading_a_fifo");
    let mut fifo = std::fs::File::open(FIFO.get().unwrap()).unwrap();
    black_box(fifo.read(&mut [0; 64]).ok());
    after_the_call();
}
