//! In the log format the manifests ship, every log record is one physical line: a
//! hang report's stack stays inside its record, so that `kubectl logs` and a
//! line-based log pipeline keep the report whole.

use std::time::Duration;

use crate::support::{Process, eventually};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The value of `RECONCILE_WATCHDOG_LOG_FORMAT` in the Deployment the manifests ship.
fn shipped_log_format() -> String {
    let deployment = include_str!("../../manifests/deployment.yaml");
    let mut lines = deployment.lines().map(str::trim);
    lines
        .by_ref()
        .find(|l| *l == "- name: RECONCILE_WATCHDOG_LOG_FORMAT")
        .expect("the Deployment sets RECONCILE_WATCHDOG_LOG_FORMAT");
    let value = lines.next().expect("its value");
    value
        .strip_prefix("value:")
        .expect("a value: line after the name")
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// Whether `line` starts a record of `format`: a JSON object, or a text record's
/// RFC 3339 timestamp.
fn starts_a_record(format: &str, line: &str) -> bool {
    match format {
        "json" => serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object()),
        _ => {
            let b = line.as_bytes();
            b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
        }
    }
}

#[test]
fn the_shipped_log_format_keeps_a_hang_report_with_its_stack_on_one_line() {
    let format = shipped_log_format();
    let format_flag = format!("--log-format={format}");
    let demo = Process::start(&[
        "demo",
        &format_flag,
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=0",
        "--duration=5m",
        "--hang-kind=block",
        "--hang-after=500ms",
        "--reconcile-deadline=1s",
        "--watchdog-interval=100ms",
        "--stack-capture-after=300ms",
        // Long enough that the stack is captured before the hang ends, on a loaded
        // machine too: the first capture of a debug binary loads its symbols (a second
        // or more), and a poll that ends meanwhile discards the stack as stale.
        "--hang-for=6s",
    ]);
    // The report with its stack, then its end: every line of it written by then.
    eventually(PATIENCE, "the hang's end", || {
        demo.logs()
            .iter()
            .any(|l| l.contains("reconcile ended after hang"))
            .then_some(())
    });
    let logs = demo.logs();
    let report = logs
        .iter()
        .find(|l| l.contains("reconcile hung: cert-renewer demo/cert-7"))
        .expect("the hang report");
    if cfg!(all(feature = "stack-capture", target_os = "linux")) {
        assert!(
            report.contains("take_config_lock"),
            "the stack is in the record: {report}"
        );
    }
    let orphans: Vec<&String> = logs
        .iter()
        .filter(|l| !starts_a_record(&format, l))
        .collect();
    assert!(
        orphans.is_empty(),
        "{format}: lines that do not start a record: {orphans:#?}"
    );
}
