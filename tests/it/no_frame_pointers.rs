//! Hang reports' stacks in an operator author's own build: `tests/stack-fixtures`, a crate
//! outside this workspace (so without its wrapper, which forces frame pointers on this
//! repository's crates), built in release with the profile docs/stack-capture.md gives
//! embedders, once without frame pointers and once with `-Cforce-frame-pointers=yes` on
//! every crate, and in debug. Each of its cases blocks a guarded reconcile in a function of its own
//! (sleep, a std mutex, a condvar, a socket read, a pipe read, `Command::output`, and a
//! sleep from a frame that holds stale frame records of calls that have returned); the
//! stack the library captures of the blocked worker must name that function with file
//! and line, and every frame from the blocking call up to the guard's poll must be on
//! the real call chain.

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

const GUARD_POLL: &str =
    "<reconcile_watchdog::guard::guarded::Guarded<F> as core::future::future::Future>::poll";

/// Builds the fixture in release (or debug) with `rustflags`, and returns its binary.
/// The builds share one target folder. Flags are given with the host named as
/// `--target`, so that they reach the fixture's crates alone, built in a folder of their
/// own (the host's), and the release builds compile their build scripts and proc macros
/// once.
fn build(release: bool, rustflags: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stack-fixtures");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = (!rustflags.is_empty()).then(host);
    let built = Command::new(&cargo)
        .args(["build", "--locked", "--quiet"])
        .args(release.then_some("--release"))
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
        .join(if release { "release" } else { "debug" })
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

/// Runs `case` of `binary`: whether it keeps frame pointers, and the frames captured.
fn run(binary: &Path, case: &str) -> (bool, Vec<Frame>, String) {
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
    for line in out.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields[..] {
            ["frame_pointers", yes] => keeps = Some(yes == "yes"),
            ["frame", function, file, line] => frames.push(Frame {
                function: function.to_owned(),
                file: file.to_owned(),
                line: line.parse().ok(),
            }),
            _ => {}
        }
    }
    (keeps.expect("a frame_pointers line"), frames, out)
}

/// Asserts the stack of `case` in `binary`: see the module's doc.
fn check(binary: &Path, frame_pointers: bool) {
    for &(case, blocking, inside) in CASES {
        let (keeps, frames, out) = run(binary, case);
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
            .position(|f| f.function == GUARD_POLL)
            .unwrap_or_else(|| panic!("{case}: the walk does not reach the guard's poll\n{out}"))
            + at;
        for frame in &frames[at..guard] {
            assert!(
                on_the_chain_to_the_guard(&frame.function),
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

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_without_frame_pointers() {
    check(&build(true, ""), false);
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_with_frame_pointers() {
    check(&build(true, "-Cforce-frame-pointers=yes"), true);
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn blocked_reconciles_are_named_on_the_real_chain_in_a_debug_build() {
    check(&build(false, ""), false);
}
