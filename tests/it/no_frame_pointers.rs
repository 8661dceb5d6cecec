//! Hang reports' stacks in an operator author's own build: `tests/stack-fixtures`, a crate
//! outside this workspace (so without its wrapper, which forces frame pointers on this
//! repository's crates), built four ways: in release with the profile docs/stack-capture.md
//! gives embedders, the same with `-Cforce-frame-pointers=yes` on every crate, with fat
//! LTO, one codegen unit and `panic = "abort"`, and in debug.
//!
//! Each of its ordinary cases blocks a guarded reconcile in a function of its own
//! (sleep, a std mutex, a condvar, a socket read, a pipe read, `Command::output`, and a
//! sleep from a frame that holds stale frame records of calls that have returned); the
//! stack the library captures of the blocked worker must name that function with file
//! and line, and every frame from the blocking call up to the guard's poll must be on
//! the real call chain, with no note: these stay whole in every build.
//!
//! Its adversarial cases (`stack-fixtures/src/adversarial.rs`) block in shapes a walk
//! can get wrong, each printing the chain of its own functions it really went through;
//! each shown stack is judged against that chain, frame by frame: true (the whole chain
//! up to the guard's poll, no note), cut (a correct start of it, with a note saying why
//! it ends or where the gap is), false (a frame that is not on the chain, or out of
//! order) or missing (a frame of the chain left out without a note). False and missing
//! fail the test; each build prints its counts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cases of the fixture, each with what the frames inside the blocking call (those
/// innermost of the blocking function) may be named: the C library's call and the
/// standard library's functions that lead to it, nothing else.
const CASES: &[(&str, &str, &[&str])] = &[
    ("sleep", "blocking_in_sleep", &["sleep"]),
    ("mutex", "blocking_in_mutex", &["syscall", "futex", "Mutex"]),
    (
        "condvar",
        "blocking_in_condvar",
        &["syscall", "futex", "Condvar"],
    ),
    ("socket", "blocking_in_socket_read", &["recv", "read"]),
    ("pipe", "blocking_in_pipe_read", &["read"]),
    (
        "command",
        "blocking_in_command_output",
        &["poll", "read_output", "cvt_r", "output", "wait"],
    ),
    ("stale", "blocking_in_a_frame_never_written", &["sleep"]),
];

/// The frames of the reconcile's own code between the blocking function and the guard:
/// the fixture's functions and the guard's panic catching around the poll.
fn on_the_chain_to_the_guard(function: &str) -> bool {
    function.starts_with("stack_fixtures::")
        || function.starts_with("<reconcile_watchdog::guard::guarded::Guarded<F>")
        || function.starts_with("<core::panic::unwind_safe::AssertUnwindSafe<F>")
        || matches!(
            function,
            "std::panicking::catch_unwind::do_call"
                | "std::panicking::catch_unwind"
                | "std::panic::catch_unwind"
                // What catch_unwind calls through: a function of its own in debug builds.
                | "__rust_try"
        )
}

/// The adversarial cases: the case, what the frames inside its blocking call may be
/// named, and what frames of other crates between the fixture's own may be named (the
/// machinery a case blocks under).
const ADVERSARIAL: &[(&str, &[&str], &[&str])] = &[
    ("fn_pointer", &["sleep"], &[]),
    ("dyn_trait", &["sleep"], &[]),
    ("aligned_leaf", &["sleep"], &[]),
    ("aligned_caller", &["sleep"], &[]),
    ("big_leaf", &["sleep"], &[]),
    ("big_caller", &["sleep"], &[]),
    ("huge_leaf", &["sleep"], &[]),
    ("tail_call", &["sleep"], &[]),
    ("tail_call_libc", &["sleep"], &[]),
    (
        "once_lock",
        &["sleep"],
        &[
            "once",
            "Once",
            "call_once",
            "FnOnce",
            "initialize",
            "get_or_init",
        ],
    ),
    (
        "block_in_place",
        &["sleep"],
        &["tokio::", "block_in_place", "call_once", "FnOnce"],
    ),
    (
        "block_on",
        &["sleep"],
        &[
            "futures_executor::",
            "futures_util::",
            "std::thread::local::",
            "core::future::",
            "Future>::poll",
            "block_on",
        ],
    ),
    ("libc_read", &["read"], &[]),
    ("libc_nanosleep", &["sleep"], &[]),
    ("fifo_open", &["open", "cstr", "File", "cvt"], &[]),
    ("fifo_read", &["read"], &["File"]),
];

const GUARD_POLL: &str =
    "<reconcile_watchdog::guard::guarded::Guarded<F> as core::future::future::Future>::poll";

/// Builds the fixture with `profile` (`release`, `lto` or `dev`) and `rustflags`, and
/// returns its binary. The builds share one target folder. Flags are given with the
/// host named as `--target`, so that they reach the fixture's crates alone, built in a
/// folder of their own (the host's), and the release builds compile their build scripts
/// and proc macros once. With `STACK_FIXTURES_BUILT` set to a folder, the fixture is not
/// built: that folder's binary named `name` is judged (one built against another
/// version of the library, to compare).
fn build(profile: &str, rustflags: &str, name: &str) -> PathBuf {
    if let Some(built) = std::env::var_os("STACK_FIXTURES_BUILT") {
        return PathBuf::from(built).join(name);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stack-fixtures");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = (!rustflags.is_empty()).then(host);
    let built = Command::new(&cargo)
        .args(["build", "--locked", "--quiet", "--profile", profile])
        .args(host.iter().flat_map(|host| ["--target", host]))
        .current_dir(root.join("tests/stack-fixtures"))
        // No wrapper (the repository's .cargo/config.toml is found from the fixture's
        // folder too), and only these flags: as an embedding operator builds.
        .env("RUSTC_WORKSPACE_WRAPPER", "")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", rustflags)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the fixture did not build ({rustflags:?})");
    target
        .join(host.unwrap_or_default())
        .join(if profile == "dev" { "debug" } else { profile })
        .join("stack-fixtures")
}

/// The host's target triple, as rustc names it.
fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("-vV").output().expect("rustc runs");
    String::from_utf8_lossy(&version.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

/// One frame as the fixture prints it.
#[derive(Debug)]
struct Frame {
    function: String,
    file: String,
    line: Option<u32>,
}

/// What a run printed: whether it keeps frame pointers, the frames captured, the note,
/// the chain it recorded (outermost first) and all of its output.
struct Run {
    keeps: bool,
    frames: Vec<Frame>,
    note: Option<String>,
    chain: Vec<String>,
    out: String,
}

/// Runs `case` of `binary`.
fn run(binary: &Path, case: &str) -> Run {
    let run = Command::new(binary)
        .arg(case)
        .output()
        .expect("the fixture runs");
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{case} failed: {}\n{out}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut keeps = None;
    let mut frames = Vec::new();
    let mut note = None;
    let mut chain = Vec::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields[..] {
            ["frame_pointers", yes] => keeps = Some(yes == "yes"),
            ["frame", function, file, line] => frames.push(Frame {
                function: function.to_owned(),
                file: file.to_owned(),
                line: line.parse().ok(),
            }),
            ["stopped_early", why] => note = Some(why.to_owned()),
            ["chain", ..] => chain = fields[1..].iter().map(|&f| f.to_owned()).collect(),
            _ => {}
        }
    }
    Run {
        keeps: keeps.expect("a frame_pointers line"),
        frames,
        note,
        chain,
        out,
    }
}

/// Asserts the stack of `case` in `binary`: see the module's doc.
fn check(binary: &Path, frame_pointers: bool) {
    for &(case, blocking, inside) in CASES {
        let Run {
            keeps, frames, out, ..
        } = run(binary, case);
        assert_eq!(keeps, frame_pointers, "the fixture's own build");
        assert!(!out.contains("stopped_early\t"), "{case}: cut short\n{out}");
        let named = format!("stack_fixtures::{blocking}");
        let at = frames
            .iter()
            .position(|f| f.function == named)
            .unwrap_or_else(|| panic!("{case}: no {named}\n{out}"));
        let frame = &frames[at];
        assert!(
            frame.file.ends_with("tests/stack-fixtures/src/main.rs")
                && frame.line.is_some_and(|l| l > 0),
            "{case}: {named} without file and line\n{out}"
        );
        assert!(at > 0, "{case}: nothing inside the blocking call\n{out}");
        for frame in &frames[..at] {
            assert!(
                inside.iter().any(|part| frame.function.contains(part)),
                "{case}: {} is not on the way into the blocking call\n{out}",
                frame.function
            );
        }
        let guard = frames[at..]
            .iter()
            .position(|f| shared(&f.function).0 == GUARD_POLL)
            .unwrap_or_else(|| panic!("{case}: the walk does not reach the guard's poll\n{out}"))
            + at;
        for frame in &frames[at..guard] {
            assert!(
                on_the_chain_to_the_guard(shared(&frame.function).0),
                "{case}: {} is not on the chain from {named} to the guard\n{out}",
                frame.function
            );
        }
        eprintln!(
            "{case}: {} frames, {named} at {}:{:?}",
            frames.len(),
            frame.file,
            frame.line
        );
    }
}

/// How an adversarial case's stack compares with the chain it recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// The whole chain up to the guard's poll, without a note.
    True,
    /// A correct start of the chain, with a note.
    Cut,
    /// A frame not on the chain, or out of its order.
    False(String),
    /// A frame of the chain left out, without a note.
    Missing(String),
}

/// The chain entry (as the fixture records it) that `function` is, or a closure of.
fn entry_of<'a>(function: &str, chain: &'a [String]) -> Option<&'a str> {
    chain
        .iter()
        .find(|entry| {
            function == entry.as_str()
                || function
                    .strip_prefix("stack_fixtures::")
                    .is_some_and(|f| f == entry.as_str() || f.starts_with(&format!("{entry}::")))
        })
        .map(String::as_str)
}

/// `function` without the mark of a name shared by several functions' code, and whether
/// it had it: such a frame names one of them, and says so.
fn shared(function: &str) -> (&str, bool) {
    match function.rsplit_once(" (or ") {
        Some((name, rest)) if rest.ends_with(" with the same code)") => (name, true),
        _ => (function, false),
    }
}

/// Judges the stack of an adversarial case: see [`Verdict`]. A frame whose name is
/// marked as shared by several functions is not held to its name (it said it may be
/// another's).
fn judge(run: &Run, inside: &[&str], glue: &[&str]) -> Verdict {
    // Innermost first, as the frames are.
    let chain: Vec<String> = run.chain.iter().rev().cloned().collect();
    let first_own = run
        .frames
        .iter()
        .position(|f| f.function.contains("stack_fixtures::"))
        .unwrap_or(run.frames.len());
    for frame in &run.frames[..first_own] {
        let (function, is_shared) = shared(&frame.function);
        if !is_shared && !inside.iter().any(|part| function.contains(part)) {
            return Verdict::False(format!("{} inside the blocking call", frame.function));
        }
    }
    // How many entries of the chain the frames went through.
    let mut reached = 0;
    let mut skipped = Vec::new();
    let mut at_the_guard = false;
    for frame in &run.frames[first_own..] {
        if shared(&frame.function).0 == GUARD_POLL {
            at_the_guard = true;
            break;
        }
        let (function, is_shared) = shared(&frame.function);
        if function.contains("stack_fixtures::") {
            let Some(entry) = entry_of(function, &chain) else {
                if is_shared {
                    continue;
                }
                return Verdict::False(format!("{} is not on the chain", frame.function));
            };
            let index = chain.iter().position(|e| e == entry).unwrap();
            if index + 1 == reached {
                continue; // the same function again (a closure of it, or inlined)
            }
            if index < reached {
                return Verdict::False(format!("{} is out of the chain's order", frame.function));
            }
            skipped.extend(chain[reached..index].iter().cloned());
            reached = index + 1;
        } else if !is_shared
            && !on_the_chain_to_the_guard(function)
            && !glue.iter().any(|part| function.contains(part))
        {
            return Verdict::False(format!("{} is not on the chain", frame.function));
        }
    }
    if run.note.is_some() {
        return Verdict::Cut;
    }
    if !skipped.is_empty() {
        return Verdict::Missing(format!("{} left out", skipped.join(", ")));
    }
    if !at_the_guard || reached < chain.len() {
        return Verdict::Missing(format!(
            "ends after {} of {} frames of the chain, before the guard's poll",
            reached,
            chain.len()
        ));
    }
    Verdict::True
}

/// Runs the adversarial cases of `binary`, prints each verdict and the counts, and fails
/// on a false stack or a frame left out without a note.
fn adversarial(binary: &Path, build: &str) {
    let mut counts = [0; 4];
    let mut wrong = Vec::new();
    for &(case, inside, glue) in ADVERSARIAL {
        let run = run(binary, case);
        let verdict = judge(&run, inside, glue);
        eprintln!("{build}\t{case}\t{verdict:?}");
        counts[match &verdict {
            Verdict::True => 0,
            Verdict::Cut => 1,
            Verdict::False(_) => 2,
            Verdict::Missing(_) => 3,
        }] += 1;
        if matches!(verdict, Verdict::False(_) | Verdict::Missing(_)) {
            wrong.push(format!("{case}: {verdict:?}\n{}", run.out));
        }
    }
    eprintln!(
        "{build}: {} true, {} cut, {} false, {} missing a frame",
        counts[0], counts[1], counts[2], counts[3]
    );
    assert!(wrong.is_empty(), "{build}:\n{}", wrong.join("\n"));
}

/// Checks the ordinary cases of `binary` and judges its adversarial ones, all of them
/// whichever fails first.
fn judge_build(binary: &Path, frame_pointers: bool, build: &str) {
    let ordinary = std::panic::catch_unwind(|| check(binary, frame_pointers));
    adversarial(binary, build);
    if let Err(failed) = ordinary {
        std::panic::resume_unwind(failed);
    }
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_without_frame_pointers() {
    judge_build(&build("release", "", "release"), false, "release");
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_with_frame_pointers() {
    judge_build(
        &build("release", "-Cforce-frame-pointers=yes", "release-fp"),
        true,
        "release with frame pointers",
    );
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_with_fat_lto() {
    judge_build(
        &build("lto", "", "lto"),
        false,
        "fat LTO, one codegen unit, panic=abort",
    );
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_in_a_debug_build() {
    judge_build(&build("dev", "", "debug"), false, "debug");
}
