//! The termination message `demo` leaves as it exits: why liveness failed (the hung
//! reconcile and the function it is blocked in, or the runtime's stall), at most 4096
//! bytes; nothing after a clean shutdown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use crate::support::{Process, eventually, request};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// Kubernetes keeps at most this many bytes of a termination message.
const MESSAGE_BYTES: usize = 4096;

/// A fresh directory for one test's termination message.
fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("reconcile-watchdog-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// `demo` with its termination message at `path` and `args`, stopped with SIGTERM once
/// `/healthz?verbose` answers `status` with a body that contains `says`; the message it
/// leaves (empty when none).
fn message_after_sigterm(path: &Path, args: &[&str], status: u16, says: &str) -> String {
    let flag = format!("--termination-message-path={}", path.display());
    let mut all = vec!["--duration", "5m", &flag, "--watchdog-interval", "100ms"];
    all.extend_from_slice(args);
    let mut demo = Process::demo(&all);
    let addr = demo.probe_address();
    eventually(
        PATIENCE,
        &format!("/healthz to answer {status}: {says}"),
        || {
            let response = request(addr, "GET", "/healthz?verbose").ok()?;
            (response.status == status && response.body.contains(says)).then_some(())
        },
    );
    assert!(path.exists(), "the path given is created at start");
    kill_process(Pid::from_child(&demo.child), Signal::TERM).expect("SIGTERM to the demo");
    let exited = demo.wait(PATIENCE);
    assert!(exited.is_some(), "the demo did not exit on SIGTERM");
    std::fs::read_to_string(path).expect("the termination message file")
}

#[test]
fn a_block_hang_leaves_the_object_and_the_blocking_function() {
    let dir = scratch("block");
    let path = dir.join("termination-log");
    let message = message_after_sigterm(
        &path,
        &[
            "--hang-kind",
            "block",
            "--hang-after",
            "500ms",
            "--reconcile-deadline",
            "1s",
            "--stack-capture-after",
            "300ms",
        ],
        500,
        "[-]reconcilers failed",
    );
    assert!(message.len() <= MESSAGE_BYTES, "{} bytes", message.len());
    assert!(
        message.starts_with("reconcile-watchdog: liveness failed (reconcilers)"),
        "{message}"
    );
    let line = message
        .lines()
        .find(|l| l.starts_with("cert-renewer demo/cert-7: ran "))
        .unwrap_or_else(|| panic!("no line for the hung reconcile:\n{message}"));
    assert!(line.contains(" of a 1s deadline, in-poll"), "{line}");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert!(
            line.contains(
                ", in reconcile_watchdog_operator::demo::take_config_lock at src/demo.rs:"
            ),
            "{line}"
        );
    }
    // No temporary file is left beside it.
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_awaiting_hang_leaves_the_await_it_waits_in() {
    let dir = scratch("await");
    let path = dir.join("termination-log");
    let message = message_after_sigterm(
        &path,
        &[
            "--hang-kind",
            "await",
            "--hang-after",
            "500ms",
            "--reconcile-deadline",
            "1s",
        ],
        500,
        "[-]reconcilers failed",
    );
    assert!(
        message.contains("\ncert-renewer demo/cert-7: ran ")
            && message.contains(
                ", awaiting, waiting in the await labelled \"waiting for the cert issuer\""
            ),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_runtime_stall_leaves_the_stall() {
    let dir = scratch("wedge");
    let path = dir.join("termination-log");
    let message = message_after_sigterm(
        &path,
        &[
            "--hang-kind",
            "wedge",
            "--hang-after",
            "500ms",
            "--reconcile-deadline",
            "30s",
            "--runtime-stall-threshold",
            "1s",
        ],
        500,
        "[-]runtime failed",
    );
    assert!(message.len() <= MESSAGE_BYTES, "{} bytes", message.len());
    assert!(
        message.starts_with("reconcile-watchdog: liveness failed ("),
        "{message}"
    );
    assert!(
        message
            .lines()
            .any(|l| l.starts_with("runtime: async runtime heartbeat is ")),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_clean_shutdown_leaves_nothing() {
    let dir = scratch("clean");
    let path = dir.join("termination-log");
    let message =
        message_after_sigterm(&path, &["--hang-kind", "none"], 200, "healthz check passed");
    assert_eq!(message, "", "a clean shutdown wrote a termination message");
    std::fs::remove_dir_all(&dir).unwrap();
}
