//! The binary's `demo` hangs, seen from outside: the stack in a `block` hang's report,
//! and the probes of a wedged runtime.

use crate::support;

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
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") == "demo/cert-7"
    });
    assert_eq!(field(&hung, "state"), "in-poll", "{hung}");
    // Other reconciles queued behind the blocked worker (or whose timers it stopped)
    // are its victims: reported starved, under the stall report when the runtime
    // stalls, never as awaits that never woke.
    for victim in demo.events().into_iter().filter(|e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") != "demo/cert-7"
    }) {
        assert_eq!(field(&victim, "state"), "starved", "{victim}");
    }
    for stall in demo
        .events()
        .into_iter()
        .filter(|e| field(e, "message").contains("are its victims"))
    {
        assert_eq!(field(&stall, "state"), "starved", "{stall}");
    }
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
fn a_spin_hang_reports_the_spinning_function_with_its_file_and_line() {
    let demo = demo(&[
        "--hang-kind",
        "spin",
        "--hang-after",
        "500ms",
        "--reconcile-deadline",
        "1s",
        "--watchdog-interval",
        "100ms",
        "--stack-capture-after",
        "500ms",
    ]);
    let hung = event(&demo, "the spin hang's report", |e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") == "demo/cert-7"
    });
    assert_eq!(field(&hung, "state"), "in-poll", "{hung}");
    let stack = field(&hung, "stack");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        // Stopped by the signal, unwound from its registers off the thread.
        assert!(
            stack.contains("spin_until_released at src/demo.rs:"),
            "{stack}"
        );
        assert!(
            stack.contains("(recorded by a signal to the thread, which was running)"),
            "{stack}"
        );
    } else {
        assert!(stack.starts_with("unavailable:"), "{stack}");
    }
    let kernel = field(&hung, "kernel_state");
    assert!(kernel.starts_with("state R"), "{kernel}");
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

#[test]
fn a_wedged_runtime_reports_the_reconciles_it_starves_as_its_victims() {
    // The set-up that showed it: past their 2s deadline while every worker is blocked, the
    // other reconciles were reported as awaits that never woke.
    let demo = demo(&[
        "--hang-kind",
        "wedge",
        "--hang-after",
        "1s",
        "--reconcile-deadline",
        "2s",
        "--runtime-stall-threshold",
        "1s",
        "--watchdog-interval",
        "200ms",
        "--stack-capture-after",
        "off",
    ]);
    let victims = event(&demo, "the stall's victims", |e| {
        field(e, "message").starts_with("async runtime stalled:")
            && field(e, "message").contains("are its victims")
    });
    assert_eq!(field(&victims, "state"), "starved", "{victims}");
    let count = victims.get("count").and_then(serde_json::Value::as_u64);
    assert!(count.is_some_and(|n| n >= 1), "{victims}");
    assert!(field(&victims, "starved").contains("demo/"), "{victims}");
    // The wedging reconciles themselves are hangs inside a poll.
    event(&demo, "a wedging reconcile's report", |e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "state") == "in-poll"
    });
    let misattributed: Vec<_> = demo
        .events()
        .into_iter()
        .filter(|e| field(e, "message").contains("an await that never woke"))
        .collect();
    assert!(
        misattributed.is_empty(),
        "victims reported as awaits that never woke: {misattributed:#?}"
    );
}

/// Built with the `task-dump` feature and `RUSTFLAGS="--cfg tokio_unstable"` (its own
/// cargo invocation in `.ci/test`): an await hang's report carries its task's trace.
#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
#[test]
fn task_trace_of_an_await_hang_names_the_function_awaiting() {
    let demo = demo(&[
        "--hang-kind",
        "await",
        "--hang-after",
        "500ms",
        "--reconcile-deadline",
        "1s",
        "--watchdog-interval",
        "100ms",
    ]);
    let hung = event(&demo, "the await hang's report", |e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") == "demo/cert-7"
    });
    let trace = field(&hung, "task_trace");
    assert!(trace.contains("demo::await_forever"), "{hung}");
    // The reconcile's frames, not the guard's around them.
    assert!(!trace.contains("catch_unwind"), "{hung}");
    assert!(trace.len() <= 2048, "{}", trace.len());
}

#[test]
fn a_block_hang_is_one_error_and_the_runtime_keeps_its_timers() {
    // The hung reconcile wakes from a sleep (the driver's) before it blocks: without
    // the watchdog waking an idle worker, every timer of the demo would stop with it.
    let demo = demo(&[
        "--hang-kind",
        "block",
        "--hang-after",
        "500ms",
        "--reconcile-deadline",
        "1s",
        "--runtime-stall-threshold",
        "1s",
        "--watchdog-interval",
        "100ms",
        "--stack-capture-after",
        "off",
    ]);
    let rescue = event(&demo, "the rescue's WARN", |e| {
        field(e, "message").starts_with("a reconcile blocked a runtime worker in one poll")
    });
    assert_eq!(field(&rescue, "level"), "WARN", "{rescue}");
    assert_eq!(field(&rescue, "object"), "demo/cert-7", "{rescue}");
    event(&demo, "the block hang's report", |e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") == "demo/cert-7"
    });
    // Three times the stall threshold after the hang: the runtime never stalled, and
    // the one ERROR is the hang's.
    std::thread::sleep(Duration::from_secs(3));
    let events = demo.events();
    let stalled: Vec<_> = events
        .iter()
        .filter(|e| field(e, "message").contains("runtime stalled"))
        .collect();
    assert!(stalled.is_empty(), "{stalled:#?}");
    let errors: Vec<_> = events
        .iter()
        .filter(|e| field(e, "level") == "ERROR")
        .collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        field(errors[0], "message").starts_with("reconcile hung: cert-renewer demo/cert-7"),
        "{errors:#?}"
    );
    let healthz = request(demo.probe_address(), "GET", "/healthz/runtime").expect("an answer");
    assert_eq!(healthz.status, 200, "{}", healthz.body);
}

#[test]
fn driver_rescue_after_off_wakes_no_worker() {
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
        "off",
        "--driver-rescue-after",
        "off",
    ]);
    event(&demo, "the block hang's report", |e| {
        field(e, "message").starts_with("reconcile hung:") && field(e, "object") == "demo/cert-7"
    });
    // With the rescue on, its WARN comes 20 ms into the block, a second before the report.
    std::thread::sleep(Duration::from_secs(1));
    let rescues: Vec<_> = demo
        .events()
        .into_iter()
        .filter(|e| field(e, "message").contains("an idle worker was woken"))
        .collect();
    assert!(rescues.is_empty(), "{rescues:#?}");
}
