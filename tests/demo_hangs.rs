//! The binary's `demo` hangs, seen from outside: the stack in a `block` hang's report,
//! and the probes of a wedged runtime.

mod support;

use std::time::{Duration, Instant};

use support::{Process, eventually, field, request};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

fn demo(args: &[&str]) -> Process {
    let mut all = vec!["--duration", "5m"];
    all.extend_from_slice(args);
    Process::demo(&all)
}

/// The first JSON log event that `matches`, once it is written.
fn event(
    process: &Process,
    what: &str,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually(PATIENCE, what, || {
        process.events().into_iter().find(|e| matches(e))
    })
}

#[test]
fn a_block_hang_reports_the_blocking_frames() {
    let demo = demo(&[
        "--hang-kind",
        "block",
        "--hang-after",
        "500ms",
        "--reconcile-deadline",
        "1s",
        "--watchdog-interval",
        "100ms",
        "--stack-capture-after",
        "500ms",
    ]);
    let hung = event(&demo, "the block hang's report", |e| {
        // Another reconcile queued behind the blocked worker may be reported (awaiting)
        // as well; this test is about the one blocked inside its poll.
        field(e, "message").starts_with("reconcile hung:")
            && field(e, "object") == "demo/cert-7"
            && field(e, "state") == "in-poll"
    });
    assert_eq!(field(&hung, "level"), "ERROR", "{hung}");
    let stack = field(&hung, "stack");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert!(stack.contains("take_config_lock"), "{stack}");
        assert!(
            stack.contains("futex") && stack.contains("Mutex<T>::lock"),
            "{stack}"
        );
    } else {
        assert!(stack.starts_with("unavailable:"), "{stack}");
    }
    let kernel = field(&hung, "kernel_state");
    assert!(kernel.starts_with("state S"), "{kernel}");
}

#[test]
fn a_wedged_runtime_fails_healthz_while_the_probe_keeps_answering() {
    let threshold = Duration::from_secs(1);
    let interval = Duration::from_millis(200);
    let demo = demo(&[
        "--hang-kind",
        "wedge",
        "--hang-after",
        "1s",
        "--runtime-stall-threshold",
        "1s",
        "--watchdog-interval",
        "200ms",
        // Only the runtime check should speak.
        "--reconcile-deadline",
        "10m",
    ]);
    let addr = demo.probe_address();
    // Every request must be answered within the client's timeout (5s), before and
    // after the flip: `request` fails on a timeout.
    let healthz = || request(addr, "GET", "/healthz?verbose").expect("the probe answers");
    assert_eq!(healthz().status, 200);

    event(&demo, "the injection", |e| {
        field(e, "message") == "injecting a hang"
    });
    let injected = Instant::now();
    let body = eventually(PATIENCE, "/healthz to fail on the runtime check", || {
        let response = healthz();
        (response.status == 500 && response.body.contains("[-]runtime failed:"))
            .then_some(response.body)
    });
    eprintln!(
        "healthz failed about {:?} after the injection (seen in the logs) (threshold {threshold:?} + 2 x {interval:?} = {:?})",
        injected.elapsed(),
        threshold + interval * 2
    );
    assert!(body.contains("healthz check failed"), "{body}");
    assert!(body.contains("[+]ping ok"), "{body}");
    for _ in 0..5 {
        let response = request(addr, "GET", "/healthz/runtime").expect("the probe answers");
        assert_eq!(response.status, 500, "{}", response.body);
        std::thread::sleep(interval);
    }

    let stalled = event(&demo, "the stall report", |e| {
        field(e, "message").starts_with("async runtime stalled")
    });
    assert_eq!(stalled.get("workers").and_then(|w| w.as_u64()), Some(4));
    assert!(
        field(&stalled, "in_poll").contains("demo-worker"),
        "{stalled}"
    );
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert!(
            field(&stalled, "stack").contains("take_config_lock"),
            "{stalled}"
        );
    }
}
