//! A pause of the whole process is not a stall: `demo` stopped 8 s (SIGSTOP, as a node
//! freeze or a VM pause would) and continued writes one WARN and keeps liveness, and a
//! real wedge after it is still reported.

use crate::support;

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use support::{Process, eventually, field, request};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The watchdog's hang reports (its other targets, such as progress, are not judged).
fn hang_lines(demo: &Process, level: &str) -> Vec<serde_json::Value> {
    demo.events()
        .into_iter()
        .filter(|e| field(e, "target") == "reconcile_watchdog::hang" && field(e, "level") == level)
        .collect()
}

#[test]
fn a_stopped_process_is_paused_not_stalled_and_a_later_wedge_still_fails_liveness() {
    let wedge_after = Duration::from_secs(16);
    let demo = Process::demo(&[
        "--duration",
        "5m",
        "--reconcile-deadline",
        "3s",
        "--runtime-stall-threshold",
        "3s",
        "--hang-kind",
        "wedge",
        "--hang-after",
        &humantime::format_duration(wedge_after).to_string(),
    ]);
    let started = Instant::now();
    let addr = demo.probe_address();
    let healthz = || request(addr, "GET", "/healthz?verbose").expect("the probe answers");
    eventually(PATIENCE, "liveness to pass", || {
        (healthz().status == 200).then_some(())
    });

    let pid = Pid::from_child(&demo.child);
    kill_process(pid, Signal::STOP).expect("SIGSTOP to the child");
    std::thread::sleep(Duration::from_secs(8));
    kill_process(pid, Signal::CONT).expect("SIGCONT to the child");

    // From the first answer after the pause, liveness passes, until the wedge.
    let watch_until = started + wedge_after - Duration::from_secs(1);
    assert!(
        Instant::now() + Duration::from_secs(3) < watch_until,
        "the machine was too slow to watch liveness after the pause"
    );
    while Instant::now() < watch_until {
        let response = healthz();
        assert_eq!(response.status, 200, "after the pause: {}", response.body);
        std::thread::sleep(Duration::from_millis(100));
    }
    let pause = eventually(PATIENCE, "the pause's WARN", || {
        hang_lines(&demo, "WARN")
            .into_iter()
            .find(|e| field(e, "message").starts_with("the process was not scheduled for"))
    });
    assert!(
        field(&pause, "message").contains("(paused or CPU-throttled): no verdict for that time"),
        "{pause}"
    );
    let paused = humantime::parse_duration(field(&pause, "paused")).expect("a duration");
    assert!(paused >= Duration::from_secs(7), "{pause}");
    assert_eq!(
        hang_lines(&demo, "WARN").len(),
        1,
        "{:#?}",
        hang_lines(&demo, "WARN")
    );
    assert!(
        hang_lines(&demo, "ERROR").is_empty(),
        "ERROR lines for a pause: {:#?}",
        hang_lines(&demo, "ERROR")
    );

    // A real wedge after the pause still fails liveness, and is reported.
    eventually(PATIENCE, "/healthz to fail on the wedge", || {
        let response = healthz();
        (response.status == 500 && response.body.contains("[-]runtime failed:")).then_some(())
    });
    eventually(PATIENCE, "the stall report", || {
        hang_lines(&demo, "ERROR")
            .into_iter()
            .find(|e| field(e, "message").starts_with("async runtime stalled"))
    });
}
